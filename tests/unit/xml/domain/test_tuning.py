"""saltvirt.xml.domain.tuning: CPU, memory and NUMA elements as definition.build writes them, read back the way
virt.update compares them, each case a golden file (tests/golden/domain/<case>.xml, see tests/support/golden.py)."""

import pytest

from saltvirt.model import cpumem
from saltvirt.model import vmspec as spec
from saltvirt.xml.domain import definition, tuning
from saltvirt.xml.etree import read
from tests.support.goldenvm import check_features, vm


def cpu_dict(value):
    """VMSpec fields of Salt's cpu dict: <cpu> (with its NUMA cells), <vcpu> attributes, <cputune>."""
    model = cpumem.cpu_detail(value)[1]
    return {"vcpu": model.pop("vcpu", None), "cputune": model.pop("tuning", None), "cpu_model": model}


FEATURE_CASES = {
    "cpu-custom-topology-features": vm(
        cpu=4,
        cpu_model=cpumem.cpu_detail(
            {
                "maximum": 4,
                "match": "exact",
                "model": {"name": "qemu64", "fallback": "forbid"},
                "topology": {"sockets": 1, "cores": 2, "threads": 2},
                "features": {"vmx": "disable", "pdpe1gb": "optional"},
            }
        )[1],
    ),
    "cpu-tuning-numa": vm(
        cpu=4,
        mem=256,
        **cpu_dict(
            {
                "maximum": 4,
                "current": 2,
                "placement": "static",
                "cpuset": "0-3",
                "tuning": {
                    "vcpupin": {0: "0-1", 1: "2,3", 2: "1-4,^2"},
                    "emulatorpin": "0",
                    "shares": 2048,
                    "period": 100000,
                    "quota": 50000,
                    "emulator_period": 100000,
                    "emulator_quota": -1,
                },
                "numa": {
                    0: {"cpus": "0-1", "memory": "128m", "memAccess": "shared"},
                    1: {"cpus": "2-3", "memory": 128, "discard": True},
                },
            }
        ),
    ),
    "mem-hotplug-hugepages": vm(
        mem=256,
        mem_current=128,
        max_mem={"size": 1024, "slots": 4},
        memory_backing=cpumem.memory_backing(
            {"hugepages": [{"size": "2m", "nodeset": "0"}, {"size": "1g"}], "nosharepages": True, "locked": True},
            numa_cells=1,
        ),
        **cpu_dict({"maximum": 2, "numa": {0: {"cpus": "0-1", "memory": 256}}}),
    ),
    "mem-backing-memfd": vm(
        memory_backing=cpumem.memory_backing(
            {"hugepages": True, "source": "memfd", "access": "shared", "allocation": "immediate", "discard": True}
        )
    ),
    "numatune-memnodes": vm(
        mem=256,
        numatune=cpumem.numatune(
            {
                "memory": {"mode": "interleave", "nodeset": "0"},
                "memnodes": {0: {"nodeset": 0}, 1: {"mode": "preferred", "nodeset": "0"}},
            },
            numa_cells=2,
        ),
        **cpu_dict({"maximum": 2, "numa": {0: {"cpus": "0", "memory": 128}, 1: {"cpus": "1", "memory": 128}}}),
    ),
    "cpu-host-passthrough": vm(cpu_model=cpumem.cpu_detail({"maximum": 2, "mode": "host-passthrough"})[1]),
    "memtune-limits": vm(memtune=cpumem.mem_detail({"boot": "256m", "hard_limit": "1g", "soft_limit": 512})[1]),
    "numatune-strict": vm(numatune=cpumem.numatune({"memory": {"mode": "strict", "nodeset": "0"}})),
}


@pytest.mark.parametrize("case", sorted(FEATURE_CASES))
def test_golden_features(golden, case):
    """Each element is its golden file, valid for libvirt's schema and what libvirt reads back."""
    check_features(golden, case, FEATURE_CASES[case])


def test_what_goes_in_comes_back():
    """Built then read: the readers give back the spec's fields (match=exact is libvirt's default: not read)."""
    fields = cpu_dict(
        {
            "maximum": 4,
            "model": {"name": "qemu64", "fallback": "forbid"},
            "topology": {"sockets": 1, "cores": 2, "threads": 2},
            "features": {"vmx": "disable"},
            "placement": "static",
            "cpuset": "0-3",
            "tuning": {"vcpupin": {0: "0-1"}, "emulatorpin": "0", "shares": 2048},
            "numa": {0: {"cpus": "0-1", "memory": 128}, 1: {"cpus": "2-3", "memory": 128}},
        }
    )
    numa = {"memory": {"mode": "interleave", "nodeset": "0"}, "memnodes": {0: {"nodeset": 0}}}
    fields.update(
        memory_backing=cpumem.memory_backing({"hugepages": [{"size": "2m", "nodeset": "0"}], "locked": True}, 2),
        numatune=cpumem.numatune(numa, 2),
        memtune=cpumem.mem_detail({"boot": "256m", "hard_limit": "1g", "soft_limit": 512})[1],
    )
    s = spec.VMSpec(name="t1", cpu=4, mem=256, mem_current=128, max_mem={"size": 1024, "slots": 4}, **fields)
    root = read(definition.build(s))
    assert tuning.facts(root, compare=True) == {"cpu": 4, "mem": 256, "current_mem": 128, "vcpu_current": 4}
    assert tuning.feature_facts(root) == {
        "cpu_model": s.cpu_model,
        "memtune": s.memtune,
        "numatune": s.numatune,
        "vcpu": s.vcpu,
        "cputune": s.cputune,
        "max_mem": s.max_mem,
        "memory_backing": s.memory_backing,
    }
    bare = read(definition.build(spec.VMSpec(name="t2", cpu=1, mem=64)))
    assert tuning.feature_facts(bare) == {
        "cpu_model": None,
        "memtune": None,
        "numatune": None,
        "vcpu": {"placement": "static", "cpuset": None},
        "cputune": None,
        "max_mem": None,
        "memory_backing": None,
    }
