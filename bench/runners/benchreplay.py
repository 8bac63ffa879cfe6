"""bench_fleetwire's floor: a runner that returns a recorded ``salt-run virt.query`` answer (msgpack file) as
``virt.query`` returns it, so ``salt-run`` pays its own start-up and Salt's return path (the return event, output
masking, the outputter) for the same data, and nothing else: no publication, no wire, no verification."""

import salt.payload


def query(path):
    with open(path, "rb") as fh:
        data = salt.payload.loads(fh.read(), encoding="utf-8")
    return {"outputter": "virt_query", "data": data}
