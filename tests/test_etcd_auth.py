"""etcd locked down (cellstate/etcd_auth.py), against real etcd servers started here
with TLS, ``--client-cert-auth`` and auth on: a client without credentials gets
nothing, a credentialed one only its cell's keys and only as its role allows, and
compose's own set-up (its certificates, its etcd-auth command, its servers' [etcd]
table) works as written."""

from __future__ import annotations

import time
import tomllib
from collections.abc import Iterator
from pathlib import Path

import attrs
import pytest
import yaml

from cellstate.api.auth import Identity, Kind
from cellstate.api.config import server_config
from cellstate.api.tls import TlsFiles
from cellstate.errors import ConfigError
from cellstate.etcd_auth import EtcdAccess, EtcdUser, RoleKind, lock_down, role_name
from cellstate.keys import Keyspace, metrics_prefix
from cellstate.kv.base import Compare, Delete, KVError, Put, UnavailableError, prefix_end
from cellstate.kv.etcd import EtcdAuthError, EtcdKV, MemberStatus
from cellstate.maintenance import LOCK_KEY, Maintainer, MaintenancePolicy
from omega.certs import DevCA
from omega.cli import main
from omega.etcd_launcher import LocalEtcd
from tests.etcd_fixture import make_local_etcd

pytestmark = pytest.mark.etcd

ROOT = Path(__file__).resolve().parents[1]
CELL = "default"
CELL_KEY = Keyspace(CELL).root + b"config"
SERVER = Identity(Kind.SERVER, "cellstate-0")
CHECK = Identity(Kind.OPERATOR, "check")
PASSWORD = "correct horse battery staple"


class Locked:
    """A running etcd with TLS, client-certificate auth and the cell's roles."""

    def __init__(self, etcd: LocalEtcd, ca: DevCA, folder: Path) -> None:
        self.etcd = etcd
        self.ca = ca
        self.folder = folder

    def access(self, identity: Identity) -> EtcdAccess:
        files = self.ca.ensure(identity)
        return EtcdAccess(files.ca, files.cert, files.key)

    def kv(self, identity: Identity) -> EtcdKV:
        return self.access(identity).connect([self.etcd.endpoint], CELL, timeout=3.0)

    def root(self) -> EtcdKV:
        files = self.ca.issue_etcd_root(keep=True)
        return EtcdAccess(files.ca, files.cert, files.key).connect([self.etcd.endpoint], CELL)

    def revision(self) -> int:
        with self.root() as kv:
            return kv.range(b"\x00").revision


@pytest.fixture(scope="module")
def locked(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Locked]:
    folder = tmp_path_factory.mktemp("locked-etcd")
    ca = DevCA(folder / "certs")
    etcd = make_local_etcd(tls=ca.issue_etcd_member("etcd", ["127.0.0.1"]),
                           probe_tls=ca.issue_etcd_root())
    try:
        etcd.start()
        password_file = folder / "password"
        password_file.write_text(PASSWORD + "\n")
        root_files = ca.issue_etcd_root(keep=True)
        with EtcdAccess(ca.ca_path, root_files.cert, root_files.key).connect(
                [etcd.endpoint], CELL) as root:
            made = lock_down(root, CELL, [EtcdUser(str(SERVER), RoleKind.SERVER),
                                          EtcdUser(str(CHECK), RoleKind.READER),
                                          EtcdUser("svc", RoleKind.SERVER, PASSWORD)])
            assert f"role {role_name(CELL, RoleKind.SERVER)}" in made
            root.txn([], [Put(CELL_KEY, b"{}"), Put(b"/omega/other/config", b"{}")])
        yield Locked(etcd, ca, folder)
    finally:
        etcd.stop()


def _refused(locked: Locked, kv: EtcdKV, *, error: type[KVError] = EtcdAuthError) -> None:
    """Every kind of call ``kv`` makes is refused with ``error``, changing nothing."""
    before = locked.revision()
    with kv:
        for call in (lambda: kv.range(CELL_KEY),
                     lambda: kv.txn([], [Put(CELL_KEY, b"taken")]),
                     lambda: kv.watch(CELL_KEY)):
            with pytest.raises(error):
                call()
    assert locked.revision() == before


def test_a_client_without_credentials_is_refused(locked: Locked) -> None:
    # Plaintext: etcd speaks only TLS.
    _refused(locked, EtcdKV([locked.etcd.endpoint], timeout=1.0), error=UnavailableError)
    # TLS without a client certificate: the handshake fails, and the error says why.
    no_cert = EtcdKV([locked.etcd.endpoint], timeout=1.0,
                     ca_cert=locked.ca.ca_path.read_bytes())
    with no_cert, pytest.raises(UnavailableError, match="TLS handshake failed"):
        no_cert.range(CELL_KEY)
    _refused(locked, EtcdKV([locked.etcd.endpoint], timeout=1.0,
                            ca_cert=locked.ca.ca_path.read_bytes()), error=UnavailableError)


def test_a_certificate_of_another_ca_is_refused(locked: Locked, tmp_path: Path) -> None:
    stranger = DevCA(tmp_path / "other")
    files = stranger.issue(SERVER)  # the same name, the wrong CA
    access = EtcdAccess(locked.ca.ca_path, files.cert, files.key)
    _refused(locked, access.connect([locked.etcd.endpoint], CELL, timeout=1.0),
             error=UnavailableError)


def test_a_certificate_naming_no_etcd_user_is_refused(locked: Locked) -> None:
    # A valid certificate of the cell (a scheduler's): schedulers have no etcd user.
    _refused(locked, locked.kv(Identity(Kind.SCHEDULER, "batch")))


def test_the_server_role_reaches_its_cells_keys_and_nothing_else(locked: Locked) -> None:
    with locked.kv(SERVER) as kv:
        assert kv.max_txn_ops == 256  # learned by reading inside the cell's prefix
        rev = kv.txn([], [Put(CELL_KEY, b"{}"),
                          Put(metrics_prefix(CELL) + b"batch/b0", b"{}")]).revision
        assert kv.range(CELL_KEY).kvs[0].mod_revision == rev
        root = Keyspace(CELL).root
        with kv.watch(root, prefix_end(root)) as watch:
            assert watch.alive
        lease = kv.lease_grant(10)  # instances and agents hold leased keys
        kv.txn([Compare.absent(LOCK_KEY)], [Put(LOCK_KEY, b"cellstate-0", lease)])
        kv.lease_revoke(lease)
        before = locked.revision()
        for outside in (b"/omega/other/config", b"/omega/defaultx", b"/", b"\x00"):
            with pytest.raises(EtcdAuthError, match="permission denied"):
                kv.range(outside)
            with pytest.raises(EtcdAuthError, match="permission denied"):
                kv.txn([], [Put(outside, b"mine")])
        with pytest.raises(EtcdAuthError, match="permission denied"):
            kv.range(b"/omega/", prefix_end(b"/omega/"))  # every cell at once
        with pytest.raises(EtcdAuthError):  # etcd's administration is root's
            kv.user_add("mallory", "x")
        with pytest.raises(EtcdAuthError):
            kv.user_grant_role(str(SERVER), "root")
        assert locked.revision() == before


def test_the_reader_role_reads_and_writes_nothing(locked: Locked) -> None:
    with locked.kv(CHECK) as kv:
        assert kv.range(CELL_KEY).kvs
        before = locked.revision()
        with pytest.raises(EtcdAuthError, match="permission denied"):
            kv.txn([], [Put(CELL_KEY, b"{}")])
        with pytest.raises(EtcdAuthError, match="permission denied"):
            kv.range(b"/omega/other/config")
        assert locked.revision() == before


def test_a_password_user_over_tls(locked: Locked) -> None:
    """With --client-cert-auth every client needs a certificate of the cell's CA; a
    password's token then decides the user (the certificate here names none)."""
    files = locked.ca.ensure(Identity(Kind.SCHEDULER, "batch"))
    password_file = locked.folder / "password"
    access = EtcdAccess(files.ca, files.cert, files.key, user="svc",
                        password_file=password_file)
    with access.connect([locked.etcd.endpoint], CELL) as kv:
        assert kv.range(CELL_KEY).kvs
        with pytest.raises(EtcdAuthError, match="permission denied"):
            kv.range(b"/omega/other/config")
    wrong = locked.folder / "wrong"
    wrong.write_text("guess")
    bad = attrs.evolve(access, password_file=wrong)
    with bad.connect([locked.etcd.endpoint], CELL) as kv, pytest.raises(
            EtcdAuthError, match="rejected the credentials of user 'svc'"):
        kv.range(CELL_KEY)


def test_lock_down_runs_again_without_changing_anything(locked: Locked) -> None:
    with locked.root() as root:
        assert lock_down(root, CELL, [EtcdUser(str(SERVER), RoleKind.SERVER)]) == []


def test_bad_access_settings_say_what_is_wrong(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"etcd.cert \(--etcd-cert\) without etcd.ca"):
        EtcdAccess(cert=tmp_path / "c.pem")
    with pytest.raises(ConfigError, match="go together"):
        EtcdAccess(user="svc")
    with pytest.raises(ConfigError, match=r"etcd.ca: .*missing.pem: no such file"):
        EtcdAccess(ca=tmp_path / "missing.pem").connect(["127.0.0.1:1"], CELL)
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(ConfigError, match=r"etcd\.password_file: .* is empty"):
        EtcdAccess(user="svc", password_file=tmp_path / "empty").connect(["127.0.0.1:1"], CELL)
    with pytest.raises(ConfigError, match=r"s\.toml: etcd\.cert: expected a string"):
        server_config({"etcd": {"ca": "ca.pem", "cert": 3}}, "s.toml")
    with pytest.raises(ConfigError, match=r"s\.toml: etcd\.password: unknown setting"):
        server_config({"etcd": {"user": "svc", "password": "inline"}}, "s.toml")


def test_composes_etcd_set_up_works_on_a_real_etcd(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """docker-compose.yml's certs and etcd-auth commands and its servers' [etcd] table,
    run here against a real etcd with etcd-0's certificate (its /certs is tmp_path)."""
    services = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]

    def here(argv: list[object]) -> list[str]:
        return [str(a).replace("/certs", str(tmp_path)).replace("/ca/", f"{tmp_path}-ca/")
                for a in argv]

    assert main(here(services["certs"]["command"])[1:]) == 0
    member = TlsFiles(tmp_path / "ca.pem", tmp_path / "etcd-member-etcd-0.pem",
                      tmp_path / "etcd-member-etcd-0.key")
    root = TlsFiles(tmp_path / "ca.pem", tmp_path / "etcd-root.pem", tmp_path / "etcd-root.key")
    with make_local_etcd(tls=member, probe_tls=root) as etcd:
        setup = here(services["etcd-auth"]["command"])[1:]
        setup[setup.index("--etcd") + 1] = etcd.endpoint
        assert main(setup) == 0
        assert "etcd auth on for cell default: made user root" in capsys.readouterr().out
        assert main(setup) == 0  # a restart of the one-shot service changes nothing
        assert "everything was there already" in capsys.readouterr().out

        toml = (ROOT / "compose/server.toml").read_text().replace("/certs", str(tmp_path))
        access = server_config(tomllib.loads(toml)).etcd_access
        with access.connect([etcd.endpoint], CELL) as kv:
            kv.txn([], [Put(CELL_KEY, b"{}")])
            with pytest.raises(EtcdAuthError, match="permission denied"):
                kv.txn([], [Put(b"/elsewhere", b"x")])

        check = ["check", "--etcd", etcd.endpoint, "--etcd-ca", str(tmp_path / "ca.pem")]
        reader = [*check, "--etcd-cert", str(tmp_path / "operator-check.pem")]
        assert main(reader) == 0
        assert "ok" in capsys.readouterr().out
        scheduler = [*check, "--etcd-cert", str(tmp_path / "scheduler-batch.pem")]
        assert main(scheduler) == 2  # a certificate of the cell, but no etcd user: refused
        assert "etcd refused the call: etcdserver: permission denied" in (
            capsys.readouterr().err)
        assert main(check) == 3  # no certificate: no TLS handshake, so no etcd answers
        assert "TLS handshake failed" in capsys.readouterr().err


def _defrag_due(status: MemberStatus, policy: MaintenancePolicy) -> bool:
    return status.free_bytes >= policy.defrag_free_fraction * status.db_size > 0


def test_a_locked_down_servers_maintenance_says_defragmenting_needs_root(
        locked: Locked) -> None:
    """The server role may not defragment (etcd's root may): the maintenance loop says
    so, and tries again only at the defragmentation pace, not every pass."""
    now = [1000.0]
    policy = MaintenancePolicy(defrag_free_fraction=0.01, defrag_min_free_bytes=0,
                               defrag_min_interval=600.0)
    with locked.kv(SERVER) as kv:
        # Free pages in the backend, so that a defragmentation is due.
        scratch = Keyspace(CELL).root + b"scratch/"
        for i in range(20):
            kv.txn([], [Put(scratch + b"%d" % i, b"x" * 100_000)])
        rev = kv.txn([], [Delete(scratch, prefix_end(scratch))]).revision
        kv.compact(rev, physical=True)
        # The freed pages show in the size in use after the backend's next commit.
        deadline = time.monotonic() + 10
        while not _defrag_due(kv.member_status(locked.etcd.endpoint), policy):
            assert time.monotonic() < deadline, "etcd freed too few pages"
            kv.txn([], [Put(scratch + b"tick", b"")])
            time.sleep(0.1)
        maintainer = Maintainer(kv, "cellstate-0", policy, clock=lambda: now[0])
        try:
            first = maintainer.run_once()
            assert first.holder  # the lock key is within the server role's keys
            (error,) = first.errors
            assert "needs etcd's root role" in error and "permission denied" in error
            now[0] += 10
            assert maintainer.run_once().errors == ()
            now[0] += 600
            assert "needs etcd's root role" in maintainer.run_once().errors[0]
        finally:
            maintainer.release()
