"""`sunk tokens`: the one component that holds the cluster's JWT key."""
