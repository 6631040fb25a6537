# SPDX-License-Identifier: Apache-2.0
"""Steps in container images (`--podnet-image`, issue 9): the task runs in the image with
Apptainer inside the job's pod (same network and PID namespaces, same uid), from a SIF
file or an image directory, in `srun` steps and in batch scripts (`#SBATCH`), MPI with
PMIx across two nodes included; a bad image fails the step with a clear message."""

from __future__ import annotations

import base64
import subprocess
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest
from conftest import needs, pods, scancel, ssh, wait_for
from test_apptainer import install_mkroot
from test_jobs import build_mpi_hello

pytestmark = needs("apptainer")

ROOT = "/opt/podnet-e2e-images"
SIF = f"{ROOT}/small.sif"  # a few binaries (test_apptainer.MKROOT)
DIR = f"{ROOT}/full"  # the node's own /usr, hard-linked: MPI and ps inside
NODES = ("c1", "c2")

MAKE_DIR_IMAGE = f"""set -e
d={DIR}
rm -rf "$d.tmp"
mkdir -p "$d.tmp"
# the node's /usr without what no step in it uses (a copy: the lab's overlay root has no
# hard links across its layers; half of /usr is compilers, podnet's own files and docs)
mkdir "$d.tmp/usr"
tar -C /usr --exclude=./local --exclude=./include --exclude=./libexec/gcc --exclude=./lib/gcc \
    --exclude=./share/doc --exclude=./share/man --exclude=./share/locale --exclude=./lib/cni \
    --exclude=./lib/x86_64-linux-gnu/apptainer --exclude=./bin/apptainer --exclude='./bin/etcd*' \
    --exclude='./bin/*lto-dump*' -cf - . | tar -C "$d.tmp/usr" -xpf -
cp -a /etc "$d.tmp/etc"
rm -rf "$d.tmp/etc/munge" "$d.tmp/etc/podnet" "$d.tmp"/etc/ssh/ssh_host_*
for l in bin sbin lib lib64; do [ -L /$l ] && ln -s usr/$l "$d.tmp/$l"; done
mkdir -p "$d.tmp/proc" "$d.tmp/sys" "$d.tmp/dev" "$d.tmp/tmp" "$d.tmp/run" "$d.tmp/home" \\
    "$d.tmp/var/tmp" "$d.tmp/var/spool/slurmd"
echo podnet-dir-image >"$d.tmp/etc/podnet-image"
rm -rf "$d" && mv "$d.tmp" "$d"
"""


@pytest.fixture(scope="module", autouse=True)
def images() -> Iterator[None]:
    """The same two images on c1 and c2, readable by everyone (built on both at once)."""

    def build(node: str) -> None:
        mkroot = install_mkroot(node)
        ssh(
            node,
            f"mkdir -p {ROOT} && {mkroot} {ROOT}/small && "
            f"apptainer -q build -F {SIF} {ROOT}/small >/dev/null && "
            f"cat > {ROOT}/mkdir.sh <<'EOF'\n{MAKE_DIR_IMAGE}\nEOF\nsh {ROOT}/mkdir.sh && "
            f"chmod 0755 {ROOT} && chmod 0644 {SIF}",
            timeout=300,
        )

    with ThreadPoolExecutor(len(NODES)) as pool:
        for f in [pool.submit(build, n) for n in NODES]:
            f.result()
    yield
    for node in NODES:
        ssh(node, f"rm -rf {ROOT}", check=False, timeout=120)


def srun(
    args: str, cmd: str, check: bool = True, timeout: float = 180, env: str = ""
) -> subprocess.CompletedProcess[str]:
    """`srun` as alice from the login node (`env`: VAR=value words before it)."""
    return ssh(
        "alice@login",
        f"cd /tmp && {env} srun -t 5 {args} {cmd}",
        check=check,
        timeout=timeout,
    )


def test_a_step_runs_in_a_sif_inside_its_pod() -> None:
    probe = (
        "sh -c 'cat /etc/podnet-image 2>/dev/null || echo host; id -u; "
        "readlink /proc/self/ns/net /proc/self/ns/pid'"
    )
    out = ssh(
        "alice@login",
        f'cd /tmp && salloc -N1 -w c1 -t 5 sh -c "srun {probe}; srun --podnet-image={SIF} {probe}"',
        timeout=180,
    ).stdout.split()
    assert len(out) == 8, out
    plain, image = out[:4], out[4:]
    assert plain[0] == "host" and image[0] == "podnet-test-image", out
    assert image[1] == plain[1] == "2001", out
    # the same pod: network and PID namespaces of the job's plain steps, not the host's
    assert image[2:] == plain[2:], out
    host = ssh("c1", "readlink /proc/1/ns/net /proc/1/ns/pid").stdout.split()
    assert plain[2] != host[0] and plain[3] != host[1], (out, host)


def test_a_directory_image_on_two_nodes_sees_only_its_job() -> None:
    out = srun(
        f"-N2 -w c1,c2 --podnet-image={DIR}",
        "sh -c 'cat /etc/podnet-image; ps -e -o pid=,comm= | sort -n | head -1'",
    ).stdout.split()
    assert out.count("podnet-dir-image") == 2, out
    # PID 1 of what the task sees is the pod's init
    assert out.count("podnet-init") == 2 and out.count("1") == 2, out


def test_exit_code_comes_back_through_srun() -> None:
    p = srun(f"-N1 -w c1 --podnet-image={SIF}", "sh -c 'exit 7'", check=False)
    assert p.returncode == 7, (p.returncode, p.stderr)


def test_scancel_signal_reaches_the_task_in_its_image() -> None:
    """`scancel --signal=USR1` reaches the shell running in the image; its exit status
    comes back through srun (the sbatch script runs the imaged step)."""
    script = (
        "#!/bin/sh\n"
        f"srun -N1 -n1 --podnet-image={SIF} sh -c "
        '\'trap "echo got-usr1; exit 7" USR1; cat /etc/podnet-image; '
        "while :; do sleep 1; done'\n"
        "echo srun-rc=$?\n"
    )
    b64 = base64.b64encode(script.encode()).decode()
    ssh("login", f"echo {b64} | base64 -d >/tmp/img-usr1.sh && chmod 0755 /tmp/img-usr1.sh")
    out = ssh(
        "alice@login",
        "cd /tmp && sbatch --parsable -J imgusr1 -w c1 -N1 -t 5 "
        "-o /tmp/img-usr1-%j.out /tmp/img-usr1.sh",
    ).stdout
    job = int(out.strip().split(";")[0])

    def output() -> str:  # written by the batch step on c1
        return str(ssh("c1", f"cat /tmp/img-usr1-{job}.out", check=False).stdout)

    try:
        wait_for(lambda: "podnet-test-image" in output(), 120)
        ssh("login", f"scancel --signal=USR1 {job}.0")
        text = wait_for(lambda: "srun-rc=" in (o := output()) and o, 60)
        assert "got-usr1" in text and "srun-rc=7" in text, text
    finally:
        scancel(job)


def test_mpi_with_pmix_across_two_nodes_in_an_image() -> None:
    build_mpi_hello()
    out = ssh(
        "alice@login",
        "cd /tmp && env OMPI_MCA_pml=ob1 OMPI_MCA_osc=^ucx "
        "OMPI_MCA_btl=self,tcp OMPI_MCA_btl_tcp_if_include=eth0 OMPI_MCA_oob_tcp_if_include=eth0 "
        f"srun --mpi=pmix -N2 -n2 -w c1,c2 -t 5 --podnet-image={DIR} "
        "--bcast=/tmp/hello_mpi_bc /tmp/hello_mpi",
        timeout=240,
    ).stdout
    assert "hello rank 0 of 2" in out and "hello rank 1 of 2" in out, out
    assert "got 1" in out and "got 0" in out, out


def test_sbatch_image_runs_the_batch_scripts_steps_in_it() -> None:
    """The script itself stays in the pod without the image (it calls srun, which needs
    the node's Slurm and munge); its steps inherit the image, or opt out."""
    look = 'sh -c "cat /etc/podnet-image 2>/dev/null || echo host"'
    # --overlap: a step started right after another may find its CPU still held until the
    # first one's completion reaches slurmctld ("step creation temporarily disabled"), and
    # srun then waited 2 minutes on a loaded machine (a Slurm race, not what is tested here)
    script = f"{look}; srun -N1 --overlap {look}; srun -N1 --overlap --podnet-image=none {look}"
    out = ssh(
        "alice@login",
        f"cd /tmp && sbatch --parsable -J e2eimg -w c1 -t 5 "
        f"--podnet-image={DIR} -o /tmp/e2eimg-%j.out --wrap '{script}'",
    ).stdout
    job = int(out.strip().split(";")[0])
    wait_for(lambda: ssh("login", f"squeue -h -j {job} -o %T").stdout.strip() == "", 120)
    got = ssh("c1", f"cat /tmp/e2eimg-{job}.out").stdout.split()
    assert got == ["host", "podnet-dir-image", "host"], got


def test_a_missing_image_fails_the_step_clearly_and_leaves_nothing() -> None:
    p = ssh(
        "alice@login",
        "cd /tmp && salloc -N1 -w c1 -t 5 sh -c "
        "'echo JOB=$SLURM_JOB_ID; srun --podnet-image=/nonexistent/x.sif true; echo rc=$?'",
        timeout=180,
    )
    assert "rc=0" not in p.stdout, p.stdout
    msg = "podnet: --podnet-image=/nonexistent/x.sif: No such file or directory"
    assert msg in p.stderr, p.stderr
    job = int(p.stdout.split("JOB=")[1].split()[0])
    wait_for(lambda: not [x for x in pods("c1") if x.get("job_id") == job], 60)
    left = ssh("c1", "pgrep -u alice -af 'apptainer|squashfuse|podnet-image' || true").stdout
    assert left.strip() == "", left


def test_a_relative_image_path_is_refused_at_submission() -> None:
    p = srun("-N1 -w c1 --podnet-image=x.sif", "true", check=False)
    assert p.returncode != 0
    assert "absolute path" in p.stderr, p.stderr


def test_the_environment_form_podnet_image_and_the_command_line_wins() -> None:
    """PODNET_IMAGE=IMAGE is --podnet-image=IMAGE (issue 35, item 4); --podnet-image=none on
    the command line wins; a relative path there is refused naming the variable."""
    look = "sh -c 'cat /etc/podnet-image 2>/dev/null || echo host'"
    got = srun("-N1 -w c1", look, env=f"PODNET_IMAGE={DIR}").stdout.split()
    assert got == ["podnet-dir-image"], got
    got = srun("-N1 -w c1 --podnet-image=none", look, env=f"PODNET_IMAGE={DIR}").stdout.split()
    assert got == ["host"], got
    p = srun("-N1 -w c1", "true", check=False, env="PODNET_IMAGE=x.sif")
    assert p.returncode != 0
    assert "PODNET_IMAGE" in p.stderr and "absolute path" in p.stderr, p.stderr
