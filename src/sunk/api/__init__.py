"""sunk's Kubernetes API: custom resource types and their CRDs."""

GROUP = "sunk.dev"
# Prefix of every label, annotation, finalizer and condition sunk owns.
DOMAIN = GROUP

# Labels sunk puts on the objects it creates.
LABEL_NODESET = f"{DOMAIN}/nodeset"
LABEL_NODE = f"{DOMAIN}/node"
LABEL_TEMPLATE_HASH = f"{DOMAIN}/template-hash"
# While a Slurm job runs on a node, this taint keeps other pods off it (the
# syncer sets it); slurmd pods tolerate it.
TAINT_NODE_LOCK = f"{DOMAIN}/slurm-job"
# The pod condition the scheduler writes before it binds a pod whose Slurm job
# holds GPUs on the pod's node: message = the indices ("0,1"). A status
# condition, not an annotation: a pod's author may write its annotations but
# not its status, so sunk's GPU device plugin can trust it.
CONDITION_SLURM_GPUS = f"{DOMAIN}/SlurmGPUs"
# The extended resource sunk's GPU device plugin serves to a node's slurmd pod:
# one device that is every GPU of the node (Slurm then gives each job its own).
RESOURCE_NODE_GPUS = f"{DOMAIN}/node-gpus"
# The extended resource a pod asks for, one device per GPU (NVIDIA's name).
GPU_RESOURCE = "nvidia.com/gpu"
# NVIDIA's GPU feature discovery labels a node with its GPUs' product name:
# a NodeSet's GRES type and a pod's GPU type (`sunk.dev/gpu-type`) come from it.
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"
# sunk's GPU plugin writes on its own Node the indices of the GPUs it finds
# there ("0,2,3"): the node's inventory, kept current as GPUs come and go.
ANNOTATION_NODE_GPUS = f"{DOMAIN}/gpus"
# A slurmd pod's --conf line (features, CPUs, memory, GRES), as the NodeSet
# controller last set it: the pod reads it by the downward API, and starts
# slurmd again in the running container when it changes.
ANNOTATION_SLURMD_CONF = f"{DOMAIN}/slurmd-conf"
# Moved on each time the NodeSet controller has a pod's node register anew:
# its slurmd starts again even where the --conf line is the same.
ANNOTATION_SLURMD_REGISTRATION = f"{DOMAIN}/slurmd-registration"
# The GPUs (indices, as `sunk.dev/gpus` writes them) a slurmd pod's node
# counts in Slurm: its gres.conf line names their device files. The NodeSet
# controller sets it when it makes the pod, and changes it only on a drained,
# idle node about to register anew (a line changed under a running job would
# have Slurm mark the node invalid, and the job hang completing).
ANNOTATION_SLURMD_GPUS = f"{DOMAIN}/slurmd-gpus"
# The registration count for which the NodeSet controller last had slurmctld
# read its files again: a node registered anew is placed in the topology
# only then (Slurm dropped it with its record).
ANNOTATION_SLURMD_RECONFIGURED = f"{DOMAIN}/slurmd-reconfigured"
