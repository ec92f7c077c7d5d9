"""A run as a document: its journal exported as versioned JSON, and read back.

A fixture is what a run recorded, lifted out of Redis so that it can be kept beside the code
(under ``tests/fixtures/``, say) and replayed without a server (``journal.testing.replay``):
real model answers become deterministic tests and evals. The document, version 1::

    {
      "format": "journal-fixture",
      "version": 1,
      "workflow": "digest",
      "run_id": "2026-w42",
      "exported_at": 1792000000000,          # ms since the epoch
      "args": {"to": "team@example.com"},    # the options the run froze at its first start
      "meta": {"status": "done", ...},       # the run's meta hash as text, but for args
                                             # and the lease holder's identity
      "signals": {"approval": {...}},        # payloads delivered to the run, by name
      "versions": {"intro": 1},              # each version gate the run passed, and its value
      "steps": [                             # every record, in the order it was written
        {"key": "select", "kind": "step", "seq": 1, "attempt": 1, "fence": 1,
         "started_at": ..., "finished_at": ..., "result": [...]},
        {"key": "summarize:i1", "group": "summarize", ...}
      ]
    }

``versions`` is derived from the ``version:<gate>`` steps and checked against them when read.
Every string in the document (keys included) passes through ``journal._redact.redact`` on the
way out, so a password in a URL or a registered secret never reaches the file. A reader
refuses any other ``format``, a ``version`` it does not know, and a step that is not a record
(``BadFixture``): a fixture that half-loads would replay something the run never did.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from journal._journal import Journal
from journal._redact import redact
from journal._schema import codec, records
from journal._schema.meta import RunMeta
from journal._schema.records import Record
from journal._schema.steps import StepKey
from journal.errors import BadFixture, ControlRefused, CorruptJournal
from journal.ops.views import inspect_run

FORMAT = "journal-fixture"
VERSION = 1
# Meta fields left out: the args travel decoded, and who held the lease (a token, a host, a
# pid) is of no use to a replay and names a machine.
NOT_EXPORTED = frozenset({"args", "holder", "holder_process"})


@dataclass(frozen=True)
class Fixture:
    """One run's journal, as exported.

    Attributes:
        workflow: the workflow's name; run_id: the run id.
        args: the options the run froze at its first start.
        meta: the run's meta hash as text, without ``NOT_EXPORTED``.
        steps: every record, in the order it was written.
        signals: the payloads delivered to the run, by signal name.
        exported_at: when it was exported, in ms since the epoch.
    """

    workflow: str
    run_id: str
    args: dict[str, Any]
    meta: dict[str, str]
    steps: tuple[Record, ...]
    signals: dict[str, Any]
    exported_at: int

    @property
    def run(self) -> str:
        """The run's full id, ``workflow:run_id``."""
        return f"{self.workflow}:{self.run_id}"

    @property
    def versions(self) -> dict[str, int]:
        """Each version gate the run passed, and the version it recorded there."""
        return {
            record.key.removeprefix(StepKey.VERSION): int(record.result)
            for record in self.steps
            if record.kind == "version" and record.key.startswith(StepKey.VERSION)
        }

    def recorded(self) -> dict[str, bytes]:
        """The steps as the journal's steps hash holds them, for a replay to read."""
        return {
            record.key: records.encode(
                self.run,
                record.key,
                record.result,
                seq=record.seq,
                attempt=record.attempt,
                fence=record.fence,
                started_at=record.started_at,
                finished_at=record.finished_at,
                kind=record.kind,
                group=record.group,
            )
            for record in self.steps
        }

    def to_json(self) -> dict[str, Any]:
        """The document (see the module), as JSON types."""
        return {
            "format": FORMAT,
            "version": VERSION,
            "workflow": self.workflow,
            "run_id": self.run_id,
            "exported_at": self.exported_at,
            "args": self.args,
            "meta": self.meta,
            "signals": self.signals,
            "versions": self.versions,
            "steps": [_step_json(record) for record in self.steps],
        }

    def dumps(self) -> str:
        """The document as text: indented, keys sorted, so a diff of two exports reads well."""
        return json.dumps(self.to_json(), indent=2, sort_keys=True, ensure_ascii=False) + "\n"

    def write(self, path: str | Path) -> None:
        """Write the document to ``path``."""
        Path(path).write_text(self.dumps(), encoding="utf-8")

    @classmethod
    def read(cls, path: str | Path) -> Fixture:
        """Read a document written by ``write``.

        Raises:
            BadFixture: not a fixture this version reads (the file, the format, a field).
        """
        try:
            text = Path(path).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise BadFixture(str(path), f"cannot be read ({exc})") from None
        return cls.loads(text, source=str(path))

    @classmethod
    def loads(cls, text: str, *, source: str = "<text>") -> Fixture:
        """Read a document from its text.

        Raises:
            BadFixture: not JSON, or not a fixture this version reads.
        """
        try:
            data = codec.loads(text)
        except codec.DecodeError as exc:
            raise BadFixture(source, f"not JSON ({exc})") from None
        return cls.from_json(data, source=source)

    @classmethod
    def from_json(cls, data: Any, *, source: str = "<document>") -> Fixture:
        """Read the document's JSON form back, checking every field.

        Raises:
            BadFixture: another format, an unknown version, or a field of the wrong shape.
        """
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise BadFixture(source, f"not a {FORMAT!r} document")
        version = data.get("version")
        if version != VERSION:
            raise BadFixture(source, f"version {version!r}; this version reads {VERSION}")
        try:
            workflow, run_id = str(data["workflow"]), str(data["run_id"])
            args, meta, signals = data["args"], data["meta"], data["signals"]
            steps = data["steps"]
            exported_at = int(data["exported_at"])
        except (KeyError, TypeError, ValueError) as exc:
            raise BadFixture(source, f"lacks or mistypes a field ({exc!r})") from None
        if not (isinstance(args, dict) and isinstance(meta, dict) and isinstance(signals, dict)):
            raise BadFixture(source, "'args', 'meta' and 'signals' must be objects")
        if not isinstance(steps, list):
            raise BadFixture(source, "'steps' must be a list")
        fixture = cls(
            workflow=workflow,
            run_id=run_id,
            args=args,
            meta={str(name): str(value) for name, value in meta.items()},
            steps=tuple(_step(source, f"{workflow}:{run_id}", entry) for entry in steps),
            signals=signals,
            exported_at=exported_at,
        )
        keys = [record.key for record in fixture.steps]
        if len(set(keys)) != len(keys):
            raise BadFixture(source, "a step key appears twice")
        if data.get("versions", fixture.versions) != fixture.versions:
            raise BadFixture(source, "'versions' disagrees with its version steps")
        return fixture


def export(journal: Journal, workflow: str, run_id: str) -> Fixture:
    """One run's journal as a fixture, read in one snapshot, every string masked.

    Raises:
        ControlRefused: no such run.
    """
    view = inspect_run(journal, workflow, run_id)
    if not view.meta:
        raise ControlRefused(view.run, "no such run")
    keys = journal.keys(workflow, run_id)
    args = RunMeta(keys.run, view.meta).args or {}
    steps = tuple(
        dataclasses.replace(record, key=_masked(record.key), result=_masked(record.result))
        for record in view.steps
    )
    meta = {name: value for name, value in view.meta.items() if name not in NOT_EXPORTED}
    return Fixture(
        workflow=workflow,
        run_id=run_id,
        args=_masked(args),
        meta=_masked(meta),
        steps=steps,
        signals=_masked(view.signals),
        exported_at=int(journal.clock.now() * 1000),
    )


def _masked(value: Any) -> Any:
    """``value`` with every string in it (mapping keys too) passed through ``redact``."""
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, Mapping):
        return {_masked(key): _masked(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_masked(item) for item in value]
    return value


def _step_json(record: Record) -> dict[str, Any]:
    step: dict[str, Any] = {
        "key": record.key,
        "kind": record.kind,
        "seq": record.seq,
        "attempt": record.attempt,
        "fence": record.fence,
        "started_at": record.started_at,
        "finished_at": record.finished_at,
        "result": record.result,
    }
    if record.group is not None:
        step["group"] = record.group
    return step


def _step(source: str, run: str, entry: Any) -> Record:
    """One step of the document, checked as the journal checks a stored record."""
    if not isinstance(entry, dict) or not isinstance(entry.get("key"), str):
        raise BadFixture(source, f"a step without a string 'key': {entry!r:.80}")
    fields = {name: value for name, value in entry.items() if name != "key"}
    try:
        return Record.decode(run, entry["key"], codec.dumps(fields))
    except CorruptJournal as corrupt:
        problem = f"step {entry['key']!r} is not a record ({corrupt.detail})"
        raise BadFixture(source, problem) from None
