"""Who called a ``virt`` runner function: the user Salt authenticated for the job, never an argument.

How Salt 3008 tells a runner function its caller (``salt/client/mixins.py``, ``salt/master.py``):

* salt-api (``rest_cherrypy``, clients ``runner``/``runner_async``) and ``salt-run --eauth`` send the
  credentials to the master; ``ClearFuncs.runner`` authenticates them (eauth backend, or a token made by
  one) and starts the job with ``RunnerClient.asynchronous(fun, low, username)``. The job process sets
  ``low["__user__"] = username`` *after* the caller's keywords were put in ``low`` (so a keyword cannot
  replace it), and ``SyncClientMixin.low`` injects ``data["user"]`` as the module global ``__user__`` of
  every runner module. A caller's ``__user__=``/``__pub_user=`` keywords land in ``**kwargs`` at most.
* a local ``salt-run`` (no ``--eauth``) runs the function in the caller's own process, as the OS user
  that started it: ``__user__`` is ``salt.utils.user.get_specific_user()`` (``root``, or ``sudo_<name>``
  under sudo). Running it needs the master's files, which is operator access already.
* a master key holder (``publisher_acl`` user with the master's ``.<user>_key``) asking the master:
  ``__user__`` is the user its request names. ``LoadAuth.authenticate_key`` accepts any key holder's own
  key for a claimed ``root``, the master's user or ``sudo_<name>`` (made the master's user), and
  ``ClearFuncs.publish`` checks no ACL for them: a ``publisher_acl`` user is root-equivalent, so
  :func:`resolve` never makes one a tenant member (tests/integration/test_publisher_acl.py shows the claim).
* ``saltutil.runner`` in a minion job and the orchestrate runner's ``salt.runner`` state pass the
  publisher's user as ``__pub_user`` in pub data (``saltmod.runner`` overwrites any SLS-given one).
* the reactor runs runner jobs as ``Reactor``; a runner started with no user at all gets ``UNKNOWN``.

Never read ``__opts__["user"]`` for the caller: ``state.orchestrate`` sets it to its caller's name, and
otherwise it is the master's own user. Who counts as an operator is in :func:`resolve`.
"""

import contextlib
import grp
import os
import pwd
from collections.abc import Mapping
from typing import Any

import salt.utils.stringutils
from salt.exceptions import SaltInvocationError

from saltvirt.base.salttypes import SaltFunctions, SaltOpts
from saltvirt.fleet import tenants
from saltvirt.fleet.tenants import Caller  # who a caller is, as tenants (below this module) need it

UNKNOWN = ("", "UNKNOWN", None)
REACTOR = "Reactor"  # salt.utils.reactor's user for the runner jobs of reactor SLS files


# one function of each runner file that shares the virtualname ``virt`` (a test checks every file has one)
RUNNER_FACES = (
    "virt.init",
    "virt.whoami",
    "virt.migrate",
    "virt.record",
    "virt.provision_assigned",
    "virt.backup",
    "virt.catalog",
    "virt.remediate",
)


def job_user(*scopes: Mapping[str, Any]) -> str | None:
    """The user Salt authenticated for this runner job: the ``__user__`` global the runner client injected.
    ``SyncClientMixin.low`` injects it into ONE module per virtualname (the first loaded function's), and
    salt-virt's ``virt`` runner is several files: pass the runner's ``globals()`` and the other files' (see
    :func:`runner_scopes`). None when the job has no known user; refused if two files disagree."""
    found = set()
    for scope in scopes:
        user = scope.get("__user__")
        if isinstance(user, str) and user not in UNKNOWN:
            found.add(user)
    if len(found) > 1:
        raise SaltInvocationError(f"this runner job has several users ({', '.join(sorted(found))}): refused")
    return found.pop() if found else None


def runner_scopes(runner_globals: Mapping[str, Any], salt_loader: SaltFunctions) -> list[Mapping[str, Any]]:
    """``runner_globals`` and the module globals of the ``virt`` runner's other files (``__salt__``)."""
    scopes = [runner_globals]
    for fun in RUNNER_FACES:
        with contextlib.suppress(KeyError, AttributeError):
            scopes.append(salt_loader[fun].__globals__)
    return scopes


def job_caller(opts: SaltOpts, runner_globals: Mapping[str, Any], salt_loader: SaltFunctions) -> Caller:
    """The :class:`Caller` of this runner job: :func:`resolve` of :func:`job_user` over every ``virt`` runner
    file (``runner_globals``: the calling file's ``globals()``; ``salt_loader``: its ``__salt__``)."""
    return resolve(opts, job_user(*runner_scopes(runner_globals, salt_loader)))


def os_groups(user: str) -> tuple:
    """The master host's groups of ``user`` (primary and supplementary), as Salt's ``%group`` ACL
    entries see them; () for a name that is no OS user (an eauth ``file`` user, say)."""
    names = set()
    with contextlib.suppress(KeyError):
        names.add(grp.getgrgid(pwd.getpwnam(user).pw_gid).gr_name)
    names.update(g.gr_name for g in grp.getgrall() if user in g.gr_mem)
    return tuple(sorted(names))


def group_users(group: str) -> tuple:
    """The master host's OS users in group ``group`` (supplementary members and those whose primary group it
    is), the users a ``group%`` entry stands for; () for no such group. Users NSS does not enumerate (an
    LDAP/sssd source with enumeration off) are not found: name them in ``members``."""
    try:
        entry = grp.getgrnam(group)
    except KeyError:
        return ()
    names = set(entry.gr_mem) | {p.pw_name for p in pwd.getpwall() if p.pw_gid == entry.gr_gid}
    return tuple(sorted(names))


def _process_user():
    try:
        return pwd.getpwuid(os.geteuid()).pw_name
    except KeyError:
        return None


def publisher_acl_user(opts: SaltOpts, user: str) -> bool:
    """True if the master's ``publisher_acl`` names ``user`` (a name, glob or regex, matched as Salt
    matches it when it makes the users' keys): such a user holds a key the master accepts for root."""
    acl = opts.get("publisher_acl") or {}
    return isinstance(acl, Mapping) and any(salt.utils.stringutils.expr_match(user, str(expr)) for expr in acl)


def resolve(opts: SaltOpts, user: str | None) -> Caller:
    """The :class:`Caller` for Salt user ``user`` (from :func:`job_user`) under the master config.

    Without ``virt:tenants`` every caller is an operator (salt-virt's behaviour before tenants). With it:
    operators are ``root``, ``sudo_<name>`` (Salt's name for root through sudo), the OS user the master
    runs as, the reactor (``Reactor``), and the users/``group%`` entries of ``virt:operators``; the others
    must be a member of exactly one tenant, and no ``publisher_acl`` user (:func:`publisher_acl_user`: it
    can run any job as root, a tenant would not hold it). Raises SaltInvocationError for a caller Salt did
    not name, a ``publisher_acl`` user and one no tenant has."""
    conf = tenants.config(opts)
    if not conf["tenants"]:
        return Caller(user or "UNKNOWN", True, why="virt:tenants is not configured: every caller is an operator")
    if not user:
        raise SaltInvocationError(
            "this runner job has no authenticated user (Salt passed none), and virt:tenants is configured: "
            "call it through salt-api or salt-run with eauth, or as root on the master"
        )
    groups = os_groups(user)
    if user == "root" or user.startswith("sudo_") or user == _process_user():
        return Caller(user, True, why="root on the master", groups=groups)
    if user == REACTOR:
        return Caller(user, True, why="the master's reactor (its SLS files are the operator's)")
    if tenants.matches(conf["operators"], user, groups):
        return Caller(user, True, why="listed in virt:operators", groups=groups)
    if publisher_acl_user(opts, user):
        raise SaltInvocationError(
            f"user {user} is in this master's publisher_acl, whose users Salt lets run any job as root (it "
            "accepts their own key for a claimed root): salt-virt gives it no tenant; the operator lists it in "
            "virt:operators, or removes it from publisher_acl and gives it eauth (salt-api, salt-run --eauth) "
            "to make it a tenant member"
        )
    found = [name for name, t in conf["tenants"].items() if tenants.matches(t["members"], user, groups)]
    if len(found) > 1:
        raise SaltInvocationError(
            f"user {user} is a member of several tenants ({', '.join(sorted(found))}): "
            "the operator must leave it in one (virt:tenants:<name>:members)"
        )
    if not found:
        raise SaltInvocationError(
            f"user {user} is in no tenant and no operator: ask the operator to add it to "
            "virt:tenants:<tenant>:members (or virt:operators) in the master config"
        )
    return Caller(user, False, tenant=found[0], why=f"member of tenant {found[0]}", groups=groups)


def tenant_members(opts: SaltOpts) -> dict[str, str]:
    """``{Salt user: tenant}`` for every user :func:`resolve` makes a tenant member under the master config: the
    names of the tenants' ``members`` and the OS users of their ``group%`` entries (:func:`group_users`). What
    the ``libvirt`` ext_pillar gives the hypervisors for the ``virt_vm`` resources' tenant gate; operators,
    ``publisher_acl`` users and users of several tenants are left out (``resolve`` gives them no tenant)."""
    conf = tenants.config(opts)
    names: set[str] = set()
    for tconf in conf["tenants"].values():
        for entry in tconf["members"]:
            names.update(group_users(entry[:-1]) if entry.endswith("%") else (entry,))
    out = {}
    for user in sorted(names):
        try:
            caller = resolve(opts, user)
        except SaltInvocationError:
            continue
        if not caller.operator and caller.tenant:
            out[user] = caller.tenant
    return out
