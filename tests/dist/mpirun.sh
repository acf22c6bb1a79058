#!/usr/bin/env bash
# tests/dist/mpirun.sh N COMMAND... — COMMAND as N ranks on this host under OpenMPI's mpirun
# (--allow-run-as-root as root; --oversubscribe: more ranks than the CI machine's 2 cores). Where
# mpirun is absent it prints "skipped: ..." and exits 0, which CTest reports as a skipped test.
set -u
n=$1
shift
if ! command -v mpirun >/dev/null; then
  echo "skipped: no mpirun on PATH (scripts/setup.sh installs openmpi-bin)"
  exit 0
fi
# OpenMPI 4's shared-memory copies use process_vm_readv, which containers often forbid.
export OMPI_MCA_btl_vader_single_copy_mechanism=${OMPI_MCA_btl_vader_single_copy_mechanism:-none}
flags=(-np "$n" --oversubscribe --bind-to none)
[[ $(id -u) == 0 ]] && flags+=(--allow-run-as-root)
exec mpirun "${flags[@]}" "$@"
