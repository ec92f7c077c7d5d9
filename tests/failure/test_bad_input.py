"""Bad input through the command line: one clear line, the documented status, nothing touched.

Every case runs ``digest run`` in its own process against one deployment that already holds
another run, crashed half-way (recorded steps, a fence, an index entry, no email yet). Each case
must print exactly one line on stderr (no traceback), exit 2 for input the user must fix or 1
for a run that failed, deliver nothing, and leave every key of that other run as it was.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fakes.anthropic_server import FakeAnthropic
from tests.forked_cli import ForkedCli
from tests.support import Deployment, only_index, wait_until

pytestmark = pytest.mark.slow

OTHER = "2026-w41"
EXIT_FAILED, EXIT_USAGE = 1, 2


class Case:
    """A deployment holding another run's journal, and a way to prove it was left alone."""

    def __init__(self, deployment: Deployment, cli: ForkedCli, fake: FakeAnthropic) -> None:
        self.deployment = deployment
        self.cli = cli
        self.fake = fake
        self.client = deployment.client()
        runtime = deployment.runtime()
        self.journal = runtime.journal
        self.claims = runtime.keys.claims

    def run(self, *args: str) -> tuple[int, str, str]:
        done = self.cli.run(self.deployment.env, "run", *args)
        return done.returncode, done.stdout, done.stderr

    def snapshot(self, skip_run: str | None = None) -> dict[bytes, bytes | None]:
        """Every key of the store with its serialized value, but ``skip_run``'s own keys.

        The model API's rate limits shared by every run are left out: any call updates them.

        The two global indexes are left out when a run is skipped (that run may update its
        own entries there); the other run's entries in them are kept as their scores. The item
        claims are kept but for the skipped run's own (a failed run keeps what it selected).
        """
        skipped = set(self.journal.keys("digest", skip_run).all()) if skip_run else set()
        indexes = {only_index(self.journal).runs, only_index(self.journal).due}
        state: dict[bytes, bytes | None] = {}
        for key in self.client.scan_iter(count=1000):
            name = key.decode()
            if name in skipped or ":{model-api:" in name:
                continue  # the model API's shared limits count every call, a refused one too
            if skip_run and name in indexes:
                score = self.client.zscore(key, f"digest:{OTHER}")
                state[key + b" " + OTHER.encode()] = None if score is None else repr(score).encode()
                continue
            if skip_run and name == self.claims:
                continue
            state[key] = self.client.dump(key)
        if skip_run:
            held = self.client.hgetall(self.claims)
            mine = f"digest:{skip_run}".encode()
            others = sorted((item, run) for item, run in held.items() if run != mine)
            state[self.claims.encode()] = repr(others).encode()
        return state


@pytest.fixture(scope="module")
def case(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Case]:
    deployment = Deployment(
        tmp_path_factory.mktemp("bad-input") / "state",
        DIGEST_CONCURRENCY="1",
        DIGEST_LEASE_TTL="1",
    )
    cli = ForkedCli(deployment.state_dir.parent)
    with FakeAnthropic() as fake:
        deployment.env.update(fake.env())
        try:
            setup = Case(deployment, cli, fake)
            crashed = cli.run({**deployment.env, "CRASH": "after:compose"}, "run", OTHER)
            assert crashed.returncode == 137, crashed.stdout + crashed.stderr
            other = setup.journal.keys("digest", OTHER)
            wait_until(lambda: not setup.client.exists(other.lease), 5, "the lease to expire")
            assert len(setup.client.hkeys(other.steps)) == 10
            assert deployment.outbox() == []
            yield setup
        finally:
            cli.close()
            deployment.close()


@pytest.fixture(autouse=True)
def unclaimed_week(case: Case) -> None:
    """Each case's run selects the shipped week: the setup's run (and earlier cases') claimed
    every item, and an item belongs to one digest, so those claims go before the case starts."""
    case.client.delete(case.claims)


def write(path: Path, content: bytes) -> str:
    path.write_bytes(content)
    return str(path)


def entry(ident: str, title: str = "A title", body: str = "A body.") -> dict[str, str]:
    return {"id": ident, "title": title, "body": body}


def items_cases(directory: Path) -> list[tuple[str, str, str]]:
    """(name, items file, what the line must say) for each broken updates file."""
    dumps = json.dumps
    return [
        ("missing", str(directory / "nowhere.json"), "file not found"),
        ("not-json", write(directory / "syntax.json", b'[{"id": "a",'), "not valid JSON at line 1"),
        ("not-a-list", write(directory / "object.json", dumps(entry("a")).encode()), "JSON list"),
        (
            "missing-field",
            write(directory / "fields.json", dumps([{"id": "a", "title": "T"}]).encode()),
            '"body" must be a non-empty string',
        ),
        (
            "duplicate-id",
            write(directory / "dupes.json", dumps([entry("a"), entry("b"), entry("a")]).encode()),
            'entry 2 (id "a"): duplicate id, also used by entry 0',
        ),
        (
            "1mb-body",
            write(directory / "huge.json", dumps([entry("a", body="x" * 1_000_000)]).encode()),
            '"body" is 1,000,000 characters, over the 100,000 limit',
        ),
        (
            "invalid-utf8",
            write(directory / "latin1.json", b'[{"id": "a", "title": "Caf\xe9", "body": "b"}]'),
            "not valid UTF-8 at byte offset 26 (byte 0xe9)",
        ),
    ]


@pytest.mark.parametrize(
    "name",
    [
        "missing",
        "not-json",
        "not-a-list",
        "missing-field",
        "duplicate-id",
        "1mb-body",
        "invalid-utf8",
    ],
)
def test_bad_items_file(name: str, case: Case, tmp_path: Path) -> None:
    _, path, says = next(c for c in items_cases(tmp_path) if c[0] == name)
    before = case.snapshot()
    calls = case.fake.calls

    code, out, err = case.run("2026-w43", "--items", path)

    assert code == EXIT_USAGE
    assert (out, len(err.splitlines())) == ("", 1), err
    assert err.startswith(f"digest: {path}: ") and says in err, err
    assert "Traceback" not in err
    assert case.deployment.outbox() == []
    assert case.fake.calls == calls
    assert case.snapshot() == before


@pytest.mark.parametrize(
    ("run_id", "says"),
    [
        ("", "invalid run id '': it is empty"),
        ("w" * 200, "invalid run id 'wwwwwwwwwwwwwwwwwwww...': it is 200 characters long"),
        ("2026{w42", "invalid run id '2026{w42': it contains '{'"),
        ("2026}w42", "invalid run id '2026}w42': it contains '}'"),
        ("2026/w42", "invalid run id '2026/w42': it contains '/'"),
        ("..", "invalid run id '..': it must not start with '..'"),
        ("2026\nw42", "invalid run id '2026\\nw42': it contains '\\n'"),
    ],
    ids=["empty", "200-chars", "open-brace", "close-brace", "slash", "dot-dot", "newline"],
)
def test_bad_run_id(run_id: str, says: str, case: Case) -> None:
    before = case.snapshot()

    code, out, err = case.run(run_id)

    assert code == EXIT_USAGE
    assert (out, len(err.splitlines())) == ("", 1), err
    assert err.startswith(f"digest: {says}; use 1-128 characters"), err
    assert "Traceback" not in err
    assert case.deployment.outbox() == []
    assert case.snapshot() == before


@pytest.mark.parametrize(
    ("garbage", "says"),
    [
        (b'{"result": "half a rec', "not valid JSON"),
        (b'{"result": "no seq"}', "not a step record"),
        (b"\xff\xfe\x00", "not valid JSON"),
    ],
    ids=["truncated", "not-a-record", "binary"],
)
def test_corrupt_journal_field(garbage: bytes, says: str, case: Case, tmp_path: Path) -> None:
    run_id = f"corrupt-{tmp_path.name[-12:].strip('_')}"
    keys = case.journal.keys("digest", run_id)
    crashed = case.cli.run({**case.deployment.env, "CRASH": "after:summarize:i2"}, "run", run_id)
    assert crashed.returncode == 137, crashed.stdout + crashed.stderr
    case.client.hset(keys.steps, "summarize:i1", garbage)
    wait_until(lambda: not case.client.exists(keys.lease), 5, "the lease to expire")
    before = case.snapshot()
    calls = case.fake.calls

    code, out, err = case.run(run_id)

    assert code == EXIT_FAILED
    assert (out, len(err.splitlines())) == ("", 1), err
    assert err.startswith(
        f"failed: run digest:{run_id}: journal field 'summarize:i1' is corrupt ({says}"
    ), err
    assert "Traceback" not in err
    assert case.client.hget(keys.steps, "summarize:i1") == garbage
    assert case.fake.calls == calls
    assert case.deployment.outbox() == []
    # Refused before the run was started: not even its own lease, fence or meta changed.
    assert case.snapshot() == before


@pytest.mark.parametrize(
    ("key", "field", "garbage", "commands"),
    [
        ("meta", "wait", b'{"kind": "signal", "st', ["run", "show", "approve"]),
        ("meta", "wait", b'{"kind": "signal"}', ["run", "show", "approve"]),
        ("signals", "approval", b'{"approved": tr', ["run", "show"]),
    ],
    ids=["wait-not-json", "wait-not-a-wait", "signal-payload"],
)
def test_corrupt_wait_or_signal(
    key: str, field: str, garbage: bytes, commands: list[str], case: Case, tmp_path: Path
) -> None:
    run_id = f"waits-{tmp_path.name[-12:].strip('_')}"
    keys = case.journal.keys("digest", run_id)
    code, _, err = case.run(run_id, "--approval")
    assert code == 0, err
    assert case.journal.meta(keys)["status"] == "waiting"
    case.client.hset(getattr(keys, key), field, garbage)
    named = f"{key}.{field}"
    before = case.snapshot()

    for command in commands:
        done = case.cli.run(case.deployment.env, command, run_id)
        assert done.returncode == EXIT_FAILED, (command, done.stderr)
        assert (done.stdout, len(done.stderr.splitlines())) == ("", 1), (command, done.stderr)
        assert done.stderr.startswith(
            f"failed: run digest:{run_id}: journal field '{named}' is corrupt ("
        ), (command, done.stderr)
        assert "repair or delete that field deliberately" in done.stderr
    assert case.deployment.outbox() == []
    assert case.snapshot() == before  # read, refused, and nothing written


def test_invalid_api_key(case: Case) -> None:
    run_id = "2026-w44"
    before = case.snapshot(skip_run=run_id)
    calls = case.fake.calls
    case.fake.fail_always(401)
    try:
        code, out, err = case.run(run_id)
    finally:
        case.fake.clear_faults()

    assert code == EXIT_FAILED
    assert out == "  ran      select\n"
    assert len(err.splitlines()) == 1, err
    assert err.startswith("failed: the API key was refused (the Anthropic API at "), err
    assert "set ANTHROPIC_API_KEY to a valid key" in err
    assert "Traceback" not in err
    assert case.fake.calls == calls + 1  # refused once: a bad key is never retried
    assert case.deployment.outbox() == []
    assert case.journal.meta(case.journal.keys("digest", run_id))["status"] == "failed"
    assert case.snapshot(skip_run=run_id) == before


def test_the_real_script_prints_the_same_line(case: Case) -> None:
    """The forked children stand in for ``digest``; one case through the script itself."""
    before = case.snapshot()

    done = case.deployment.cli("run", "2026/w42")

    assert (done.returncode, done.stdout) == (EXIT_USAGE, "")
    assert done.stderr.splitlines() == [
        "digest: invalid run id '2026/w42': it contains '/'; use 1-128 characters of letters, "
        "digits, '.', '_' or '-' (for example 2026-w42)"
    ]
    assert case.snapshot() == before
