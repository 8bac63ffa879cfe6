"""saltvirt.model.cpumem: Salt's cpu/mem dicts and numatune, key by key (their hostile values are in
test_checks.py's HOSTILE list, refused by spec.build and by virt.init before anything is defined)."""

import pytest
from salt.exceptions import SaltInvocationError

from saltvirt.model import cpumem, vmargs
from saltvirt.model import vmspec as spec


def build(**kwargs):
    args = {"name": "k1", "cpu": 1, "mem": 64, "disk": None}
    args.update(kwargs)
    host = {k: args.pop(k) for k in ("images_dir", "profiles", "allowed_paths", "image_format") if k in args}
    return spec.build(vmargs.InitRequest(**args), **{"images_dir": "/v", **host})


@pytest.mark.parametrize(
    "given, canonical",
    [("0-3,^2", "0-1,3"), ("0,1,2", "0-2"), (5, "5"), ("1-4,^2,6,7", "1,3-4,6-7"), (" 0 ", "0")],
)
def test_cpusets_come_out_as_libvirt_writes_them(given, canonical):
    assert cpumem.cpuset(given, "x") == canonical


@pytest.mark.parametrize("bad", ["", "a", "0-", "1,,2", "0x1", None, True, [0], "3-1", "1,^1", "99999"])
def test_bad_cpusets_are_refused(bad):
    with pytest.raises(SaltInvocationError, match="x"):
        cpumem.cpuset(bad, "x")


def test_salt_cpu_tuning_numa_and_vcpu_placement_are_honoured():
    s = build(
        cpu={
            "maximum": 4,
            "current": "2",
            "cpuset": "0-3,^2",
            "tuning": {"vcpupin": {0: "1-4,^2", "1": 0}, "emulatorpin": "0,1", "shares": 2048, "quota": -1},
            "numa": {"1": {"cpus": "2-3", "memory": "32m"}, 0: {"cpus": "0,1", "memory": 32, "memAccess": "shared"}},
        }
    )
    assert s.cpu == 4 and s.vcpu == {"cpuset": "0-1,3", "current": 2}  # libvirt's canonical CPU sets
    assert s.cputune == {"shares": 2048, "quota": -1, "vcpupin": {0: "1,3-4", 1: "0"}, "emulatorpin": "0-1"}
    assert [(c["id"], c["cpus"], c["memory"]) for c in s.cpu_model["numa"]] == [(0, "0-1", 32), (1, "2-3", 32)]


def test_salt_mem_current_max_slots_hugepages_are_honoured():
    s = build(
        cpu={"maximum": 2, "numa": {0: {"cpus": 0, "memory": "512m"}, 1: {"cpus": 1, "memory": "512m"}}},
        mem={"boot": "1g", "current": "512m", "max": "4g", "slots": 8, "hugepages": [{"size": "2m", "nodeset": "0,1"}]},
    )
    assert (s.mem, s.mem_current, s.max_mem) == (1024, 512, {"size": 4096, "slots": 8})
    assert s.memory_backing == {"hugepages": [{"size": 2048, "nodeset": "0-1"}]}
    assert build(mem={"boot": 64, "hugepages": True, "nosharepages": "yes"}).memory_backing == {
        "hugepages": [],
        "nosharepages": True,
    }


def test_salt_numatune_memnodes_are_honoured():
    s = build(
        cpu={"maximum": 2, "numa": {0: {"cpus": 0, "memory": 32}, 1: {"cpus": 1, "memory": 32}}},
        numatune={"memnodes": {"1": {"mode": "preferred", "nodeset": "0,1"}, 0: {"nodeset": 0}}},
    )
    assert s.numatune == {
        "memnodes": [
            {"cellid": 0, "mode": "strict", "nodeset": "0"},
            {"cellid": 1, "mode": "preferred", "nodeset": "0-1"},
        ]
    }
    assert build(numatune={"memory": {"nodeset": "0,1"}}).numatune == {"mode": "strict", "nodeset": "0-1"}


@pytest.mark.parametrize(
    "call",
    [
        lambda: cpumem.numatune({"memory": {"mode": "strict", "nodeset": "0\n"}}),
    ],
)
def test_a_trailing_newline_is_refused(call):
    """Issue 23 #8: these patterns use fullmatch ('$' with re.match passes "0-1\\n")."""
    with pytest.raises(SaltInvocationError):
        call()


@pytest.mark.parametrize(
    ("given", "mib"),
    [
        ("2GiB", 2048),
        ("2g", 2048),
        ("1 TiB", 1024 * 1024),
        ("1t", 1024 * 1024),
        ("4096k", 4),
        (512, 512),
        # Salt's virt: KB, MB, GB, TB are powers of 1000 (rounded down to whole MiB)
        ("2GB", 2 * 10**9 // 2**20),
        ("1 tb", 10**12 // 2**20),
        ("512MB", 512 * 10**6 // 2**20),
    ],
)
def test_mem_sizes_take_salts_units(given, mib):
    """Issue 36 #1: GB/TB were read as GiB/TiB."""
    assert cpumem.mib(given, "mem:boot") == mib
    assert cpumem.mem_detail({"boot": given})[0] == mib


@pytest.mark.parametrize("given", ["2XB", "2 gigs", "1ib", "2048b"])
def test_an_unknown_or_too_small_unit_is_refused_with_the_units(given):
    """Issue 36 #1: an unknown unit is refused naming the units; bytes must still make whole MiB."""
    with pytest.raises(SaltInvocationError, match=r"unknown unit .*K/KiB.* GB, TB|whole number of MiB") as err:
        cpumem.mib(given, "mem:boot")
    assert given != "2XB" or "the units are B, K/KiB, M/MiB, G/GiB, T/TiB" in str(err.value)


def test_hugepage_sizes_are_binary():
    """A page is a power of two: 2MB (2,000,000 bytes) is not a page size, 2MiB is."""
    assert cpumem._kib("2MiB", "size") == 2048
    with pytest.raises(SaltInvocationError, match="must be a page size like 2m or 1g"):
        cpumem._kib("2MB", "size")
