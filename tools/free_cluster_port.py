"""Print a free TCP port of 127.0.0.1 whose Redis Cluster bus port (10,000
above it) is free too, for the scripts that start a Cluster of their own
(soak/cluster.sh, bench/cluster_allocs.sh)."""
import random
import socket

while True:
    port = random.randint(20000, 55535)
    try:
        for candidate in (port, port + 10000):
            s = socket.socket()
            s.bind(("127.0.0.1", candidate))
            s.close()
    except OSError:
        continue
    print(port)
    break
