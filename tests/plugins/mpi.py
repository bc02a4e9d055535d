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

# Each rank sums 1 + its rank over the pods' network and prints where it ran.
HELLO = r"""
#include <mpi.h>
#include <stdio.h>
#include <unistd.h>

int main(int argc, char **argv) {
    int rank, size, mine, sum;
    char host[256];
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    gethostname(host, sizeof host);
    mine = rank + 1;
    MPI_Allreduce(&mine, &sum, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    printf("rank %d of %d on %s sum %d\n", rank, size, host, sum);
    MPI_Finalize();
    return 0;
}
"""
