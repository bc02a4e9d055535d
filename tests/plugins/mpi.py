"""An Open MPI program the MPI tests run (mpi4py): the same on every release."""

# Each rank adds 1 + its rank into 8 MiB of doubles (MPI_Allreduce on a
# buffer: the bytes cross the pods' network, well past any eager limit) and
# into a Python object (mpi4py's pickled allreduce); rank 0 prints both sums
# and where the ranks ran.
ALLREDUCE = """
from array import array
import socket
from mpi4py import MPI

comm = MPI.COMM_WORLD
count = 1 << 20
mine = array("d", [comm.rank + 1.0]) * count
summed = array("d", bytes(8 * count))
comm.Allreduce(mine, summed, op=MPI.SUM)
total = comm.allreduce(comm.rank + 1, op=MPI.SUM)
hosts = comm.gather(socket.gethostname(), root=0)
if comm.rank == 0:
    ends = {summed[0], summed[count - 1]}
    print("ranks", comm.size, "sum", total, "buffer", *ends, "hosts", *sorted(hosts))
"""
