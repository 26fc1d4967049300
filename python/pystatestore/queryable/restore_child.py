"""The restore process's entry point (`python -m pystatestore.queryable.restore_child FD SCRATCH`),
started by RestoreProcess: a module of its own, so running it does not import it twice."""

import sys
from multiprocessing.connection import Connection

from pystatestore.queryable.restorer import serve_restores

if __name__ == "__main__":
    serve_restores(Connection(int(sys.argv[1])), sys.argv[2])
