#!/bin/sh
# Open MPI's launch agent for tests/hosts/two_hosts.sh: stands in for ssh.
#
# mpirun --mca plm_rsh_agent THIS calls it as ssh would be called, `THIS HOST COMMAND...`,
# to start its daemon (orted) on HOST. Here a "host" is a network namespace of the same
# name on this machine: the command runs inside it, in a UTS namespace of its own whose
# hostname is HOST, so Open MPI sees a second node. Like ssh, the words of COMMAND are
# joined with spaces and run by a shell (Open MPI quotes its arguments for that shell).
# The daemon inherits mpirun's environment (PATH, OMPI_*), as `-x VAR` would pass it.
set -eu
[ $# -ge 2 ] || { echo "netns-agent: usage: netns-agent.sh HOST COMMAND..." >&2; exit 255; }
host=$1
shift
exec ip netns exec "$host" unshare --uts /bin/sh -c "hostname '$host' && $*"
