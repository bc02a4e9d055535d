"""The syncer: Kubernetes and Slurm agree about every node, both ways."""
