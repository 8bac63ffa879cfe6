"""A real salt-api (rest_cherrypy) in front of a real salt-master, with ``file`` eauth users: what the
integration tests use to act as a delegated caller (issue 23: an eauth user with ``@runner: [virt.*]``
and ``virt.*`` on the hypervisors; issue 26: tenants over salt-api).

Use from a module-scoped fixture::

    from tests.support import saltapi

    @pytest.fixture(scope="module")
    def api(salt_factories, state_tree, tmp_path_factory):
        users = {"alice": saltapi.User("s3cret", ["@runner-virt", {"hyper*": ["virt.*"]}])}
        with saltapi.started(salt_factories, "apimaster", state_tree, users, tmp_path_factory.mktemp("api")) as api:
            yield api          # api.master (the factory), api.client("alice"), api.url

    def test_x(api):
        status, body = api.client("alice").runner("virt.list")

``User.perms`` is Salt's eauth permission list; ``"@runner-virt"`` is shorthand for
``{"@runner": ["virt.*"]}``. Minions are started by the test with ``saltd.start_minion(api.master, ...)``.
"""

import contextlib
import dataclasses
import json
import socket
import urllib.error
import urllib.request

import salt.netapi

from tests.support import saltd
from tests.support.saltd import master_config

RUNNER_VIRT = "@runner-virt"


@dataclasses.dataclass
class User:
    password: str
    perms: list


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _perms(perms):
    return [{"@runner": ["virt.*"]} if p == RUNNER_VIRT else p for p in perms]


def api_master_config(state_tree, users, workdir, port, rest=None, **extra):
    """Master overrides: ``master_config`` plus rest_cherrypy on 127.0.0.1:``port`` (plain http: a test
    harness on loopback; ``rest``: more rest_cherrypy options) and ``file`` eauth over a plaintext users file
    in ``workdir``."""
    users_file = workdir / "eauth-users"
    users_file.write_text("".join(f"{name}:{user.password}\n" for name, user in users.items()))
    users_file.chmod(0o600)
    eauth = {"^filename": str(users_file), "^filetype": "text", "^hashtype": "plaintext"}
    eauth.update({name: _perms(user.perms) for name, user in users.items()})
    return master_config(
        state_tree,
        rest_cherrypy={"port": port, "host": "127.0.0.1", "disable_ssl": True, **(rest or {})},
        external_auth={"file": eauth},
        netapi_enable_clients=["local", "local_async", "runner", "runner_async", "wheel"],
        **extra,
    )


class Client:
    """One eauth user talking to salt-api: every request carries the credentials (``/run``, no token),
    answers are ``(http_status, body)``; ``body`` is the decoded JSON (or the raw text)."""

    def __init__(self, url, username, password, eauth="file"):
        self.url, self.creds = url, {"username": username, "password": password, "eauth": eauth}

    def post(self, path, payload, timeout=300):
        req = urllib.request.Request(
            self.url + path,
            data=json.dumps(payload).encode(),
            headers={"Content-Type": "application/json", "Accept": "application/json"},
        )
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                status, raw = resp.status, resp.read().decode()
        except urllib.error.HTTPError as exc:
            status, raw = exc.code, exc.read().decode(errors="replace")
        try:
            return status, json.loads(raw)
        except ValueError:
            return status, raw

    def run(self, lowstate, timeout=300):
        """One lowstate chunk through ``/run``: ``(status, return value)`` (``return[0]`` when 200; a runner's
        ``{outputter, data}`` wrapping is unwrapped to ``data``)."""
        status, body = self.post("/run", [dict(lowstate, **self.creds)], timeout=timeout)
        if status == 200 and isinstance(body, dict) and isinstance(body.get("return"), list):
            body = body["return"][0]
            if isinstance(body, dict) and set(body) == {"outputter", "data"}:
                body = body["data"]
        return status, body

    def runner(self, fun, timeout=300, **kwargs):
        return self.run({"client": "runner", "fun": fun, "kwarg": kwargs}, timeout=timeout)

    def local(self, tgt, fun, arg=(), timeout=300, tgt_type="glob", **kwargs):
        low = {"client": "local", "tgt": tgt, "tgt_type": tgt_type, "fun": fun, "arg": list(arg), "kwarg": kwargs}
        return self.run(dict(low, timeout=timeout), timeout=timeout + 30)


@dataclasses.dataclass
class Api:
    master: object  # the salt-master daemon factory
    url: str
    users: dict

    def client(self, username, password=None):
        return Client(self.url, username, self.users[username].password if password is None else password)


@contextlib.contextmanager
def started(salt_factories, master_id, state_tree, users, workdir, rest=None, **extra):
    """A started salt-master ``master_id`` with salt-api in front of it (``rest``: more rest_cherrypy options,
    ``extra``: more master config)."""
    port = free_port()
    overrides = api_master_config(state_tree, users, workdir, port, rest, **extra)
    master = saltd.presync(salt_factories.salt_master_daemon(master_id, overrides=overrides))
    with master.started():
        api = master.salt_api_daemon()
        with api.started():
            # Salt 3008.5: each request's NetapiClient creates <cachedir>/saltapi and its local key unlocked,
            # so simultaneous *first* requests fail with 500 (docs/topics/tenants.md says so to operators). The
            # same first construction, once, before the tests' concurrent calls (test_authority's two inits)
            salt.netapi.NetapiClient(master.config).destroy()
            yield Api(master=master, url=f"http://127.0.0.1:{port}", users=users)
