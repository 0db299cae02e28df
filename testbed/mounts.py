"""Procfs mount files in the kernel's real formats, for the storage tests and bench.

Modelled on what kernels write (the shapes prometheus/procfs keeps as fixtures): an NFSv4
mount with statvers=1.1 whose ACCESS line carries a wrapped unsigned queue time
(18446743919241604546 ms) and fewer transmissions than requests, an NFSv3 mount with
statvers=1.0 (shorter xprt line), per-op lines with and without the ninth (errors) field, a
local ext4 filesystem found through diskstats, and non-NFS mounts with only a device line.
"""

from __future__ import annotations

from pathlib import Path
from typing import Final

MOUNTINFO: Final = """\
22 1 259:2 / / rw,relatime shared:1 - ext4 /dev/nvme0n1p2 rw,errors=remount-ro
23 22 0:21 / /proc rw,nosuid,nodev,noexec,relatime shared:12 - proc proc rw
24 22 0:22 / /sys rw,nosuid,nodev,noexec,relatime shared:2 - sysfs sysfs rw
61 22 0:52 / /mnt/checkpoints rw,relatime shared:33 - nfs4 10.0.0.5:/export/ckpt rw,vers=4.1,\
rsize=1048576,wsize=1048576,namlen=255,hard,proto=tcp,timeo=600,retrans=2,sec=sys,\
clientaddr=10.0.0.17,local_lock=none,addr=10.0.0.5
62 22 0:53 / /mnt/datasets ro,relatime shared:34 - nfs 10.0.0.6:/data ro,vers=3,rsize=65536,\
wsize=65536,namlen=255,hard,proto=tcp,timeo=600,retrans=2,sec=sys,mountaddr=10.0.0.6,\
mountvers=3,mountport=20048,mountproto=udp,local_lock=none,addr=10.0.0.6
63 22 259:3 / /scratch rw,relatime shared:35 - ext4 /dev/nvme1n1 rw
64 22 0:54 / /mnt/with\\040space rw,relatime shared:36 - nfs4 10.0.0.7:/home rw,vers=4.2,\
addr=10.0.0.7
"""

MOUNTSTATS: Final = """\
device rootfs mounted on / with fstype rootfs
device proc mounted on /proc with fstype proc
device sysfs mounted on /sys with fstype sysfs
device /dev/nvme0n1p2 mounted on / with fstype ext4
device 10.0.0.5:/export/ckpt mounted on /mnt/checkpoints with fstype nfs4 statvers=1.1
\topts:\trw,vers=4.1,rsize=1048576,wsize=1048576,namlen=255,acregmin=3,acregmax=60,\
acdirmin=30,acdirmax=60,hard,proto=tcp,port=0,timeo=600,retrans=2,sec=sys,\
clientaddr=10.0.0.17,local_lock=none
\tage:\t86402
\tcaps:\tcaps=0x3ffbffff,wtmult=512,dtsize=32768,bsize=0,namlen=255
\tnfsv4:\tbm0=0xfdffafff,bm1=0xf9be3e,bm2=0x68800,acl=0x3,sessions,pnfs=not configured
\tsec:\tflavor=1,pseudoflavor=1
\tevents:\t3172 91321 12 61 2988 419 98112 5242880 0 17 5242880 47 0 2103 55 0 55 0 0 0 0 0 0 \
0 0 0 0
\tbytes:\t1207640230 21474836480 0 0 1210214218 21474836480 295483 5242880
\tRPC iostats version: 1.1  p/v: 100003/4 (nfs)
\txprt:\ttcp 832 0 1 0 11 6428 6428 0 12154 0 24 26 5726
\tper-op statistics
\t        NULL: 1 1 0 44 24 0 0 0 0
\t        READ: 1298 1298 0 207680 1210292152 6 79386 79407 0
\t       WRITE: 20480 20483 2 21477457920 2621440 8817 912004 921733 0
\t      COMMIT: 64 64 0 12288 8448 1 3318 3320 0
\t        OPEN: 55 55 0 17600 21560 0 92 95 0
\t       CLOSE: 55 55 0 11440 7040 0 31 32 0
\t     SETATTR: 12 12 0 3024 3264 0 14 15 0
\t      ACCESS: 2927395007 2927394995 0 526931094212 362996810236 18446743919241604546 \
1667369447 1953587717 3
\t     GETATTR: 91321 91321 0 14611360 21917040 41 18233 18402 0
\t      LOOKUP: 2988 2988 0 613116 716640 3 2205 2216 412
\t     READDIR: 0 0 0 0 0 0 0 0 0

device 10.0.0.6:/data mounted on /mnt/datasets with fstype nfs statvers=1.0
\topts:\tro,vers=3,rsize=65536,wsize=65536,namlen=255,acregmin=3,acregmax=60,acdirmin=30,\
acdirmax=60,hard,proto=tcp,timeo=600,retrans=2,sec=sys,mountaddr=10.0.0.6,mountvers=3,\
mountport=20048,mountproto=udp,local_lock=none
\tage:\t7200
\tcaps:\tcaps=0x3fef,wtmult=4096,dtsize=65536,bsize=0,namlen=255
\tsec:\tflavor=1,pseudoflavor=1
\tevents:\t52 226 0 0 1 13 398 0 0 331 0 47 0 0 77 0 0 77 0 0 0 0 0 0 0 0 0
\tbytes:\t5368709120 0 0 0 5370000000 0 1310720 0
\tRPC iostats version: 1.0  p/v: 100003/3 (nfs)
\txprt:\ttcp 941 1 2 0 3 40961 40961 0 41000 0
\tper-op statistics
\t        NULL: 0 0 0 0 0 0 0 0
\t     GETATTR: 226 226 0 27120 25312 0 120 133
\t      LOOKUP: 1 1 0 120 236 0 0 0
\t      ACCESS: 13 13 0 1456 1560 0 2 2
\t        READ: 40960 40961 1 5079040 5370000000 54 330311 330801
\t       WRITE: 0 0 0 0 0 0 0 0

device /dev/nvme1n1 mounted on /scratch with fstype ext4
device 10.0.0.7:/home mounted on /mnt/with\\040space with fstype nfs4 statvers=1.1
\tbytes:\t0 0 0 0 4096 8192 0 0
\tRPC iostats version: 1.1  p/v: 100003/4 (nfs)
\txprt:\ttcp 0 0 1 0 2 3 3 0 3 0 1 0 0
\tper-op statistics
\t        NULL: 1 1 0 44 24 0 0 0 0
\t       WRITE: 2 2 0 8400 160 0 1 1 0
"""

DISKSTATS: Final = """\
 259       0 nvme0n1 84121 1020 6134218 24552 301122 90112 18233104 311201 0 120331 335753 0 0 0 0
 259       2 nvme0n1p2 83001 1020 6120010 24410 301000 90112 18233000 311100 0 120200 335510 0 0 0 0
 259       3 nvme1n1 1200 0 2097152 900 4096 0 8388608 4000 0 3000 4900 12 0 40960 3 0 0
"""


LUSTRE_MOUNT: Final = (
    "70 22 0:60 / /lustre/ckpt rw,relatime shared:37 - lustre 10.0.1.1@o2ib:/ckptfs rw,flock\n"
)
# A Lustre client's llite stats (the shape lprocfs writes: count, "samples", unit, then
# min, max and sum for the byte counters).
LLITE_STATS: Final = """\
snapshot_time             1764720000.421302584 secs.nsecs
start_time                1764633600.000000000 secs.nsecs
elapsed_time              86400.421302584 secs.nsecs
read_bytes                11 samples [bytes] 4096 1048576 4202496
write_bytes               2048 samples [bytes] 1048576 4194304 6442450944
open                      2 samples [usecs] 12 40 52
close                     2 samples [usecs] 8 9 17
getattr                   9 samples [usecs] 3 30 101
"""


# The same client on Lustre 2.12 and later, in debugfs (`/sys/kernel/debug/lustre/llite/
# INSTANCE/stats`): lprocfs_stats_header's three time lines, then each counter with min, max,
# sum and, for the byte counters, the sum of squares (LPROCFS_CNTR_STDDEV).
LLITE_STATS_DEBUGFS: Final = """\
snapshot_time             1764720000.421302584 secs.nsecs
start_time                1764633600.000000000 secs.nsecs
elapsed_time              86400.421302584 secs.nsecs
read_bytes                11 samples [bytes] 4096 1048576 4202496 2216648638464
write_bytes               4096 samples [bytes] 1048576 4194304 12884901888 54043195528445952
read                      11 samples [usecs] 31 2205 4120 10124513
write                     4096 samples [usecs] 220 19884 3114002 5102554210
open                      2 samples [usecs] 12 40 52 1744
getattr                   9 samples [usecs] 3 30 101 1717
statfs                    1 samples [usecs] 88 88 88 7744
"""


def write_llite(directory: Path, instances: dict[str, str]) -> None:
    """Lustre client stats files `directory/INSTANCE/stats`, by instance name."""
    for instance, text in instances.items():
        (directory / instance).mkdir(parents=True, exist_ok=True)
        (directory / instance / "stats").write_text(text)


def write_procfs(
    root: Path,
    *,
    mountinfo: str = MOUNTINFO,
    mountstats: str = MOUNTSTATS,
    diskstats: str = DISKSTATS,
    llite: dict[str, str] | None = None,
    host: tuple[str, str] | None = None,
) -> Path:
    """A procfs tree under `root`: `self` a link to a process directory, as in /proc
    (node_exporter resolves it), holding mountinfo and mountstats; diskstats; `llite`,
    Lustre stats files by instance name (`fs/lustre/llite/INSTANCE/stats`); and, given
    `host` (mountinfo, mountstats), pid 1's of another mount namespace, as the host's /proc
    seen from a container. `root`."""
    process = root / "26231"
    process.mkdir(parents=True, exist_ok=True)
    if not (root / "self").is_symlink():
        (root / "self").symlink_to("26231")
    (process / "mountinfo").write_text(mountinfo)
    (process / "mountstats").write_text(mountstats)
    (root / "diskstats").write_text(diskstats)
    if host is not None:
        (root / "1").mkdir(exist_ok=True)
        (root / "1" / "mountinfo").write_text(host[0])
        (root / "1" / "mountstats").write_text(host[1])
    write_llite(root / "fs" / "lustre" / "llite", llite or {})
    return root


# The operations a busy NFSv4.1 client lists, in the kernel's order (a subset of ~60).
NFS4_OPERATIONS: Final = (
    "NULL", "READ", "WRITE", "COMMIT", "OPEN", "OPEN_CONFIRM", "OPEN_NOATTR", "OPEN_DOWNGRADE",
    "CLOSE", "SETATTR", "FSINFO", "RENEW", "SETCLIENTID", "LOCK", "LOCKT", "LOCKU", "ACCESS",
    "GETATTR", "LOOKUP", "REMOVE",
)  # fmt: skip


def nfs_node(mounts: int) -> tuple[str, str]:
    """(mountinfo, mountstats) of a node with `mounts` NFSv4.1 mounts, each listing the 20
    operations of `NFS4_OPERATIONS` with non-zero counters (the bench's worst case)."""
    info = ["22 1 259:2 / / rw,relatime shared:1 - ext4 /dev/nvme0n1p2 rw"]
    stats = ["device /dev/nvme0n1p2 mounted on / with fstype ext4"]
    for n in range(mounts):
        source, point = f"10.0.{n // 250}.{n % 250 + 1}:/export/ckpt{n}", f"/mnt/nfs{n}"
        info.append(
            f"{100 + n} 22 0:{60 + n} / {point} rw,relatime shared:{40 + n} - nfs4 {source} "
            "rw,vers=4.1,rsize=1048576,wsize=1048576,hard,proto=tcp,timeo=600,retrans=2"
        )
        stats += [
            f"device {source} mounted on {point} with fstype nfs4 statvers=1.1",
            "\topts:\trw,vers=4.1,rsize=1048576,wsize=1048576,hard,proto=tcp",
            f"\tage:\t{3600 + n}",
            "\tevents:\t" + " ".join(str(n + k) for k in range(27)),
            f"\tbytes:\t{n}1207640 {n}2147483 0 0 {n}1210214 {n}2147483 2954 0",
            "\tRPC iostats version: 1.1  p/v: 100003/4 (nfs)",
            "\txprt:\ttcp 832 0 1 0 11 6428 6428 0 12154 0 24 26 5726",
            "\tper-op statistics",
        ]
        stats += [
            f"\t{op:>12}: {k + n + 1} {k + n + 1} 0 {k * 100} {k * 200} {k} {k * 3} {k * 4} 0"
            for k, op in enumerate(NFS4_OPERATIONS)
        ]
    return "\n".join(info) + "\n", "\n".join(stats) + "\n"
