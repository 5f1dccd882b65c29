"""Start one HumanEval program inside the sandbox; `sandbox.py` runs this file with `python -I` and a clean environment.

Standard library only (it runs isolated from the package). argv[1] is a JSON object (see `sandbox._launch_config`).
The launcher (this process, in its own session) asks the kernel for new network, PID, mount and IPC namespaces
(plus a user namespace when not root), then forks the program's process:

- it becomes PID 1 of the new PID namespace, so it cannot name the evaluator (getppid() is 0, kill(-1) reaches only
  the namespace) and when it exits or is killed the kernel kills every process left in the namespace (setsid or not);
- the network namespace has only a loopback that is down: no socket reaches anything, `_socket` included;
- in the mount namespace every mount is remounted read-only except the program's directory, and /proc is the
  namespace's own (the evaluator's /proc/<pid>/environ does not exist there);
- as root it switches to an unused uid/gid (SANDBOX_UID_BASE + the launcher's pid; no supplementary groups): it
  owns no file, cannot signal or read root's processes, and the process-count limit (which the kernel does not
  enforce for root) counts its own processes only;
- rlimits: CPU seconds, address space per process (the evaluator divides the total memory by the process count,
  so all processes together stay within the total), file size, no core files, number of processes;
- a parent-death signal: if the launcher is killed, the program is killed.

Whatever the kernel refuses is skipped; the JSON line this launcher prints at the end names what held
(`sandbox.MECHANISMS`). The launcher kills the program when its time is up.
"""

import ctypes
import errno
import json
import os
import re
import resource
import signal
import stat
import sys

CLONE_NEWNS, CLONE_NEWIPC, CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = (
    0x20000,
    0x8000000,
    0x10000000,
    0x20000000,
    0x40000000,
)
# The program's interpreter: the base installation's, not a virtual environment's link to it. The program needs
# only the standard library (-I), the unprivileged uid may not reach the venv (a checkout inside a 0700 folder,
# e.g. `mktemp -d`), and the base installation is made reachable for it (`_expose`).
PYTHON = os.path.realpath(getattr(sys, "_base_executable", None) or sys.executable)
MS_RDONLY, MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 1, 32, 4096, 16384, 1 << 18
KEPT_MOUNT_FLAGS = 2 | 4 | 8 | 1024 | 2048 | 4096  # nosuid, nodev, noexec, noatime, nodiratime, relatime (= ST_*)
PR_SET_PDEATHSIG = 1
SANDBOX_UID_BASE = 0x7F800000  # + the launcher's pid (< 2**22): far above the ids of users and containers
LIBC = ctypes.CDLL(None, use_errno=True)


def _libc(name: str, *args) -> None:
    fn = getattr(LIBC, name, None)
    if fn is None:
        raise OSError(f"{name} is not available on this platform")
    if fn(*args) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{name}: {os.strerror(err)}")


def _mount(source, target: str, fstype, flags: int, data=None) -> None:
    def enc(s):
        return None if s is None else s.encode()

    _libc("mount", enc(source), target.encode(), enc(fstype), ctypes.c_ulong(flags), enc(data))


def _others_can_enter(path: str) -> bool:
    parts = path.strip("/").split("/")
    return all(os.stat("/" + "/".join(parts[:i])).st_mode & stat.S_IXOTH for i in range(1, len(parts) + 1))


def _expose(paths: list) -> list:
    """As root, for the unprivileged uid: a folder above one of `paths` that others cannot enter (pyenv under /root,
    0700) is covered by an empty tmpfs that holds only those paths (bound in). Returns the paths now mounted this
    way."""
    plan = []
    for path in paths:
        parts = path.strip("/").split("/")
        for i in range(1, len(parts)):
            above = "/" + "/".join(parts[:i])
            if not _others_can_enter(above):
                plan.append((above, path, os.open(path, os.O_RDONLY | os.O_DIRECTORY)))  # before it is hidden
                break
    covered = set()
    for above, path, fd in plan:
        if above not in covered:
            _mount("tmpfs", above, "tmpfs", 0, "mode=755,size=1m")
            covered.add(above)
        os.makedirs(path, mode=0o755, exist_ok=True)
        _mount(f"/proc/self/fd/{fd}", path, None, MS_BIND | MS_REC)
        os.close(fd)
    return [path for _, path, _ in plan]


def _mount_points() -> list:
    with open("/proc/self/mountinfo", encoding="utf-8") as f:  # field 5 is the mount point, octal-escaped
        return [re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), line.split()[4]) for line in f]


def _namespaces(root: bool) -> bool:
    """New namespaces for this launcher's children; False where the kernel refuses them."""
    uid, gid = os.getuid(), os.getgid()
    try:
        _libc("unshare", CLONE_NEWNET | CLONE_NEWPID | CLONE_NEWNS | CLONE_NEWIPC | (0 if root else CLONE_NEWUSER))
        if not root:  # the same ids inside, so files keep their owner
            for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"), ("gid_map", f"{gid} {gid} 1")):
                with open(f"/proc/self/{name}", "w") as f:
                    f.write(text)
        return True
    except OSError:
        return False


def _isolate_filesystem(workdir: str, root: bool) -> list:
    """Everything read-only but `workdir`; the namespace's own /proc. Returns what held."""
    held = []
    try:
        _mount(None, "/", None, MS_REC | MS_PRIVATE)  # nothing below propagates back to the host
        prefix = os.path.realpath(sys.base_prefix)
        if workdir not in (_expose([workdir, prefix]) if root else []):
            _mount(workdir, workdir, None, MS_BIND)  # its own mount, left writable below
        failed = 0
        for point in _mount_points():
            if point == workdir:
                continue
            try:
                kept = os.statvfs(point).f_flag & KEPT_MOUNT_FLAGS  # a user namespace may not drop these
                _mount(None, point, None, MS_REMOUNT | MS_BIND | MS_RDONLY | kept)
            except OSError as e:
                failed += e.errno not in (errno.ENOENT, errno.EINVAL)  # not there / hidden under another mount
        if not failed:
            held.append("read-only filesystem")
    except OSError:
        return held
    try:
        _mount("proc", "/proc", "proc", 2 | 4 | 8)
        held.append("private /proc")
    except OSError:
        pass
    return held


def _program(cfg: dict, root: bool, namespaces: bool, report_fd: int, uid: int) -> None:
    """In the forked child: apply what holds, then exec the program (never returns)."""
    held = []
    os.setsid()  # its own session and process group
    workdir = cfg["workdir"]
    if namespaces:
        held += ["network namespace", "PID namespace"] + _isolate_filesystem(workdir, root)
    resource.setrlimit(resource.RLIMIT_NPROC, (cfg["max_processes"], cfg["max_processes"]))
    if root and all(map(_others_can_enter, (os.path.dirname(workdir), os.path.realpath(sys.base_prefix)))):
        # an id nobody else uses: it owns no file, and its process count is this program's alone
        for path in (workdir, os.path.join(workdir, "program.py")):
            os.chown(path, uid, uid)
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)
        held.append("unprivileged uid")
    if os.getuid() != 0:
        held.append("process limit")
    try:
        _libc("prctl", PR_SET_PDEATHSIG, signal.SIGKILL)  # after setuid, which clears it
    except OSError:
        pass
    os.chdir(workdir)
    for limit, value in (
        (resource.RLIMIT_CPU, cfg["cpu_seconds"]),
        (resource.RLIMIT_AS, cfg["memory_bytes"]),
        (resource.RLIMIT_FSIZE, cfg["file_bytes"]),
        (resource.RLIMIT_CORE, 0),
    ):
        resource.setrlimit(limit, (value, value))
    os.write(report_fd, json.dumps(held).encode())
    os.close(report_fd)
    stderr = os.open("stderr.txt", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)  # no pipe of the evaluator's
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd, target in ((devnull, 0), (devnull, 1), (stderr, 2)):
        os.dup2(fd, target)
    os.execve(PYTHON, [PYTHON, "-I", "-c", cfg["prelude"]], cfg["env"])


def main() -> None:
    cfg = json.loads(sys.argv[1])
    root = os.getuid() == 0
    namespaces = sys.platform.startswith("linux") and _namespaces(root)
    uid = SANDBOX_UID_BASE + os.getpid()  # unique while this launcher runs
    report_r, report_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(report_r)
            _program(cfg, root, namespaces, report_w, uid)
        except BaseException as e:  # noqa: BLE001 - the launcher reports why the program did not start
            os.write(2, f"sandbox: the program could not start: {e}\n".encode())
        os._exit(127)
    os.close(report_w)
    with os.fdopen(report_r, "rb") as f:
        held = json.loads(f.read() or b"[]")
    timed_out = False

    def time_up(*_) -> None:
        nonlocal timed_out
        timed_out = True
        os.kill(pid, signal.SIGKILL)

    signal.signal(signal.SIGALRM, time_up)
    signal.setitimer(signal.ITIMER_REAL, cfg["timeout"])
    os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)  # exited, not yet reaped: its pid still names its group
    signal.setitimer(signal.ITIMER_REAL, 0)
    try:  # without a PID namespace, what is left in its process group goes (with one, the kernel did this)
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    _, status = os.waitpid(pid, 0)
    print(json.dumps({"held": held, "timed_out": timed_out, "returncode": os.waitstatus_to_exitcode(status)}))


if __name__ == "__main__":
    main()
