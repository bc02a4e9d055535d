"""The sunk scheduler: Kubernetes pods placed by Slurm, through one placeholder job each."""
