"""The NodeSet controller: one slurmd pod per matching Kubernetes node."""
