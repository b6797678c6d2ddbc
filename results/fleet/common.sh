# Sourced by results/fleet's scripts (run.sh, pairs.sh, instructions.sh): what every one of them
# must send and start alike.

# Each call's three descriptors (rls-load --descriptor-set, in this order); tollgate_*.toml and
# limitador.yaml count one limit on each.
descriptors=(
  --descriptor-set 'remote_address=10.0.0.{key}'
  --descriptor-set 'remote_address=10.0.0.{key},path=/api/items'
  --descriptor-set 'generic_key=global'
)

# A free TCP port on 127.0.0.1.
free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}
