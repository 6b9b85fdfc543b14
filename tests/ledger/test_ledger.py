"""The Run ledger (issue 41) on both backends: instructions entries at start, one entry per Run
in the transaction that starts it, gap-free numbering, and its tree."""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import hashlib
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest
import rfc8785
import sqlalchemy as sa

from agent_gateway import clock, config, merkle
from agent_gateway.gateway import Gateway
from agent_gateway.ledger import entries, instructions
from agent_gateway.ledger.service import Ledger
from agent_gateway.mcp import tools
from agent_gateway.signals.handlers import Handlers, Prompt
from agent_gateway.store import tables
from agent_gateway.store.engine import Store
from agent_gateway.store.queries import ledger as queries
from agent_gateway.store.queries import signals as signal_queries
from agent_gateway.store.queries.runs import Run
from agent_gateway.store.queries.signals import Signal
from agent_gateway.store.window import Window
from tests.signals.conftest import GatewayFactory, Recording, emit, finished, runs_of
from tests.test_merkle import mth

pytestmark = pytest.mark.processes

TEMPLATE = {"note.received": {"template": "A note: {{ text }}", "session": "notes"}}


class Fanout:
    """A Python Handler (not inline): one Prompt per Session named in the payload."""

    def handle(self, signal: Signal) -> list[Prompt]:
        return [Prompt(f"prompt for {name}", name) for name in signal.payload["sessions"]]


async def ledger(store: Store) -> list[dict[str, Any]]:
    """Every entry, oldest first, parsed; each leaf checked to be its own canonical form."""
    found = await queries.window(store, window=Window(after=0, limit=200))
    assert [entry.seq for entry in found] == list(range(1, len(found) + 1))  # gap-free from 1
    for entry in found:
        assert rfc8785.dumps(orjson.loads(entry.leaf)) == entry.leaf
    assert await queries.TREE.size(store) == len(found)
    assert await merkle.root(queries.TREE.fetcher(store), len(found)) == mth([entry.leaf for entry in found])
    parsed = [orjson.loads(entry.leaf) for entry in found]
    # Every Run started names its entry (runs.entry_seq), and only its own; a pending one none.
    async with store.read() as conn:
        rows = (await conn.execute(sa.select(tables.runs.c.id, tables.runs.c.state, tables.runs.c.entry_seq))).all()
    named = {run_id: seq for run_id, state, seq in rows if state != "pending" or seq is not None}
    assert all(seq is not None and parsed[seq - 1].get("run") == run_id for run_id, seq in named.items())
    assert {entry["run"] for entry in parsed if entry.get("run") in {row.id for row in rows}} == set(named)
    return parsed


async def restart(settings: config.Settings) -> list[dict[str, Any]]:
    gateway = Gateway(settings)
    await gateway.start()
    try:
        return await ledger(gateway.store)
    finally:
        await gateway.stop()


async def test_instructions_are_entered_at_first_start_and_again_only_when_they_change(
    settings: config.Settings,
) -> None:
    settings = dataclasses.replace(settings, handlers=TEMPLATE, runtime_env_pass=("HOME",))
    [first] = await restart(settings)
    assert first["type"] == "instructions"
    told = first["instructions"]
    assert told["handlers"] == [{"kind": "note.received", "template": "A note: {{ text }}", "session": "notes"}]
    assert told["confinement"]["envPass"] == ["HOME"]  # the names only: no value appears
    assert await restart(settings) == [first]
    changed = dataclasses.replace(settings, handlers={"note.received": {"template": "Note: {{ text }}"}})
    [_, second] = await restart(changed)
    assert second["instructions"]["handlers"] == [{"kind": "note.received", "template": "Note: {{ text }}", "session": None}]
    # Back to the first instructions: a change too, entered again.
    assert [entry["instructions"] for entry in await restart(settings)] == [told, second["instructions"], told]


async def test_a_python_handler_is_entered_by_name_and_source_digest(make_gateway: GatewayFactory) -> None:
    gateway = await make_gateway(Recording(), register={"fanout": Fanout()})
    [entry] = await ledger(gateway.store)
    source = hashlib.sha256(Path(__file__).read_bytes()).hexdigest()
    assert entry["instructions"]["handlers"] == [
        {"kind": "fanout", "python": f"{__name__}.Fanout", "sourceSha256": source}
    ]


async def test_every_run_has_one_entry_written_as_it_starts(make_gateway: GatewayFactory) -> None:
    gateway = await make_gateway(Recording(), register={"fanout": Fanout()}, handlers=TEMPLATE)
    fanned = await emit(gateway.store, "fanout", {"sessions": ["alpha", "beta"]})
    noted = await emit(gateway.store, "note.received", {"text": "hé", "big": 2**60})
    for signal_id in (fanned, noted):
        assert (await finished(gateway.store, signal_id)).state == "done"
    [instructions, *run_entries] = await ledger(gateway.store)
    runs = await runs_of(gateway.store, fanned) + await runs_of(gateway.store, noted)
    assert len(run_entries) == len(runs) == 3
    payloads = {fanned: {"sessions": ["alpha", "beta"]}, noted: None}  # 2**60 is beyond RFC 8785's numbers
    for run, entry in zip(runs, run_entries, strict=True):
        assert entry == {
            "type": "run", "run": run.id, "signal": run.signal_id,
            "kind": "fanout" if run.signal_id == fanned else "note.received", "origin": "operator",
            "session": run.session,
            "prompt": hashlib.sha256(run.prompt.encode()).hexdigest(),
            "payload": None if payloads[run.signal_id] is None
            else hashlib.sha256(rfc8785.dumps(payloads[run.signal_id])).hexdigest(),
            "instructions": 1, "startedAt": run.started_at,
        }
    assert instructions["type"] == "instructions"
    # A receipt finds a Signal's entries through its Runs, the later-started one's too.
    for signal_id in (fanned, noted):
        found = await queries.of_signal(gateway.store, signal_id=signal_id)
        assert [orjson.loads(entry.leaf)["run"] for entry in found] == [run.id for run in runs if run.signal_id == signal_id]


async def test_the_instructions_in_force_are_found_through_an_index_no_run_entry_enters(gateway: Gateway) -> None:
    """ix_ledger_entries_instructions (migration 0014) holds the instructions entries only, so a
    Run's start writes nothing into it, and the newest instructions entry is read through it."""
    store = gateway.store
    signal = Signal("5d6f3c1e-0000-4000-8000-000000000003", "k", {}, clock.now_iso(), "processing", None)
    run = Run("5d6f3c1e-0000-4000-8000-000000000004", signal.id, "s", "p", "running", None, None, None)
    async with store.transaction() as conn:
        await gateway.ledger.started(conn, signal, [run], clock.now_iso())
    async with store.read() as conn:
        newest, values = queries._LAST_INSTRUCTIONS.bind(conn.dialect, {})
        if store.dialect == "postgresql":
            await conn.exec_driver_sql("SET enable_seqscan = off")  # a table this small would be scanned
            plan = " ".join(row[0] for row in (await conn.exec_driver_sql(f"EXPLAIN {newest}", values)).all())
            indexes = (await conn.exec_driver_sql(
                "SELECT string_agg(indexdef, ';') FROM pg_indexes WHERE tablename = 'ledger_entries'"
            )).scalar()
        else:
            plan = " ".join(row[-1] for row in (await conn.exec_driver_sql(f"EXPLAIN QUERY PLAN {newest}", values)).all())
            indexes = (await conn.exec_driver_sql(
                "SELECT group_concat(sql, ';') FROM sqlite_master WHERE type = 'index' AND tbl_name = 'ledger_entries'"
            )).scalar()
        assert "ix_ledger_entries_instructions" in plan
        assert (await queries.last_instructions(conn)).seq == 1  # type: ignore[union-attr]
    [definition] = [index for index in indexes.split(";") if "ix_ledger_entries_instructions" in index]
    assert "WHERE" in definition and "'instructions'" in definition
    assert "kind_seq" not in indexes


async def test_a_rolled_back_run_start_writes_no_entry(gateway: Gateway) -> None:
    store = gateway.store
    before = len(await ledger(store))
    signal = Signal("5d6f3c1e-0000-4000-8000-000000000001", "k", {"a": 1}, clock.now_iso(), "processing", None)
    run = Run("5d6f3c1e-0000-4000-8000-000000000002", signal.id, "s", "p", "running", None, None, None)
    with pytest.raises(RuntimeError, match="rolled back"):
        async with store.transaction() as conn:
            await gateway.ledger.started(conn, signal, [run], clock.now_iso())
            raise RuntimeError("rolled back")
    assert len(await ledger(store)) == before
    # The number the rolled-back entry drew is the next one's: no gap, and the tree follows.
    async with store.transaction() as conn:
        await gateway.ledger.started(conn, signal, [run], clock.now_iso())
    assert len(await ledger(store)) == before + 1


async def test_concurrent_writers_through_separate_stores_number_one_gap_free_ledger(gateway: Gateway) -> None:
    """Two Stores (two connection pools, as two processes have) append at once: on PostgreSQL
    the ledger's lock orders them; no number is skipped or taken twice, and the tree is whole."""
    other = Store(gateway.settings.database_url)
    try:
        writers = [gateway.ledger, Ledger(other)]
        writers[1].instructions_seq = gateway.ledger.instructions_seq
        signal = Signal("5d6f3c1e-0000-4000-8000-00000000000a", "k", {}, clock.now_iso(), "processing", None)

        async def write(writer: Ledger, n: int) -> None:
            for i in range(10):
                run = Run(f"5d6f3c1e-0000-4000-8000-{n:06d}{i:06d}", signal.id, "s", "p", "running", None, None, None)
                async with writer.store.transaction() as conn:
                    await writer.started(conn, signal, [run], clock.now_iso())

        await asyncio.gather(*(write(writers[n % 2], n) for n in range(4)))
        found = await ledger(gateway.store)
        assert len({entry.get("run") for entry in found[1:]}) == len(found) - 1 == 40
    finally:
        await other.close()


async def test_a_writer_overtaken_by_another_process_numbers_its_entry_after_the_other(gateway: Gateway) -> None:
    """Each Store predicts its next entry's number from its own last entry; when another Store
    appended in between, that number is taken, and the entry is numbered after the other's:
    in the order written, gap-free, each Run naming its entry, the tree whole."""
    other = Store(gateway.settings.database_url)
    try:
        writers = [gateway.ledger, Ledger(other)]
        writers[1].instructions_seq = gateway.ledger.instructions_seq
        signal = Signal("5d6f3c1e-0000-4000-8000-00000000000b", "k", {}, clock.now_iso(), "processing", None)
        async with gateway.store.transaction() as conn:
            await signal_queries.insert(conn, id=signal.id, kind=signal.kind, payload={}, emitted_at=signal.emitted_at)
        written = []
        # Twice in a row (the prediction holds), then each overtaken by the other.
        for i, n in enumerate([0, 0, 1, 1, 0, 1, 0, 0]):
            run = Run(f"5d6f3c1e-0000-4000-8000-{n:06d}{i:06d}", signal.id, "s", "p", "running", None, None, None)
            async with writers[n].store.transaction() as conn:
                await writers[n].started(conn, signal, [run], clock.now_iso(), [run])
            written.append(run.id)
        found = await ledger(gateway.store)
        assert [entry.get("run") for entry in found[-len(written):]] == written
    finally:
        await other.close()


def test_leaves_are_rfc_8785_canonical_json() -> None:
    # RFC 8785 section 3.2.2's ordering and escapes; numbers in ECMAScript form.
    assert entries.canonical({"b": [1.0, 1e21, "\u20ac\n"], "a": True, "\u00e9": None}) == (
        '{"a":true,"b":[1,1e+21,"\u20ac\\n"],"\u00e9":null}'.encode()
    )
    leaf = entries.run(
        run_id="r", signal_id="s", kind="k", origin="operator", session=None, prompt="p", payload={"x": 1},
        instructions_seq=3, started_at="2026-11-28T00:00:00.000Z",
    )
    assert leaf == (
        b'{"instructions":3,"kind":"k","origin":"operator","payload":"' + hashlib.sha256(b'{"x":1}').hexdigest().encode()
        + b'","prompt":"' + hashlib.sha256(b"p").hexdigest().encode()
        + b'","run":"r","session":null,"signal":"s","startedAt":"2026-11-28T00:00:00.000Z","type":"run"}'
    )


def test_the_reference_llm_agent_is_entered_with_its_instructions_model_and_tools(
    settings: config.Settings, tmp_path: Path
) -> None:
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    (workspace / "told.md").write_text("Be kind to everyone.\n")
    command = (sys.executable, "-m", "agent_gateway.agent.llm", "--model", "openai:gpt-4o", "--instructions", "told.md")
    settings = dataclasses.replace(
        settings, runtime_command=command, runtime_workdir=workspace, runtime_env_pass=("OPENAI_API_KEY",),
        runtime_allow_hosts=(config.Address("api.openai.com", 443),),
    )
    told = instructions.collect(settings, Handlers(), object())
    assert told["agent"] == {
        "instructions": "Be kind to everyone.\n", "model": "openai:gpt-4o", "tools": sorted(tools.available()),
    }
    assert told["runtime"]["command"] == list(command)
    # Every argument naming a file, the program's interpreter and the instructions file in the workdir too.
    assert told["runtime"]["files"] == {
        sys.executable: hashlib.sha256(Path(sys.executable).read_bytes()).hexdigest(),
        "told.md": hashlib.sha256(b"Be kind to everyone.\n").hexdigest(),
    }
    assert told["confinement"] == {"sandbox": settings.runtime_sandbox, "allowHosts": ["api.openai.com:443"], "envPass": ["OPENAI_API_KEY"]}
    # Another program is not the reference agent: nothing is read for it.
    other = dataclasses.replace(settings, runtime_command=(sys.executable, str(workspace / "told.md")))
    told = instructions.collect(other, Handlers(), object())
    assert told["agent"] is None
    assert told["runtime"]["files"][str(workspace / "told.md")] == hashlib.sha256(b"Be kind to everyone.\n").hexdigest()


def _later(at: datetime.datetime, ms: int) -> str:
    """The instant ``ms`` milliseconds after ``at``, as stored."""
    return clock.format_instant(at + datetime.timedelta(milliseconds=ms))


@pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)
async def test_a_signal_read_ahead_is_claimed_alone_only_while_it_is_the_oldest_pending(store: Store) -> None:
    """The Signal Worker's claim of what it read ahead (PostgreSQL, one statement alone): it claims,
    records the Runs and appends the first's entry only while the Signal is pending, none is older
    and no other process appended; otherwise it writes nothing of them, and the ends it was given
    are written all the same."""
    from agent_gateway.store.queries import runs as run_queries
    from agent_gateway.store.queries import signals as signal_queries

    ledger_ = Ledger(store)
    await ledger_.record_instructions({"handlers": []})  # as at start: the tree's prediction is primed
    now = clock.now()
    ids = [f"5d6f3c1e-0000-4000-8000-0000000001{n:02d}" for n in range(9)]
    async with store.transaction() as conn:
        for n, signal_id in enumerate(ids[:3]):
            await signal_queries.insert(conn, id=signal_id, kind="k", payload={"n": n}, emitted_at=_later(now, 10 * n))

    async def claim(
        queued: signal_queries.Queued, run_id: str, ending: dict[str, Any] | None = None
    ) -> tuple[bool, str | None]:
        """Whether it claimed, and the id of the Signal it saw next (the oldest pending besides ``queued``)."""
        record = run_queries.to_record(signal_id=queued.signal.id, prompts=[(run_id, "s", "p")], first_started_at=clock.now_iso())
        async with store.alone() as conn:
            claimed, after = await ledger_.claimed_ahead(conn, queued, record, record[0].started_at, ending)  # type: ignore[arg-type]
        return claimed, None if after is None else after.signal.id

    async def state(signal_id: str) -> tuple[str, list[str]]:
        async with store.read() as conn:
            signal = await signal_queries.get(conn, id=signal_id)
        return signal.state, [run.state for run in await runs_of(store, signal_id)]  # type: ignore[union-attr]

    first = await signal_queries.oldest_pending(store)
    assert first is not None and first.signal.id == ids[0]
    assert await claim(first, ids[3]) == (True, ids[1])
    assert await state(ids[0]) == ("processing", ["running"])
    assert [entry.get("run") for entry in await ledger(store)] == [None, ids[3]]

    # Read ahead, then a Signal older than it is committed (emitted earlier, committed later): not claimed.
    second = await signal_queries.oldest_pending(store)
    assert second is not None and second.signal.id == ids[1]
    async with store.transaction() as conn:
        await signal_queries.insert(conn, id=ids[4], kind="k", payload={}, emitted_at=_later(now, 5))
    ending = signal_queries.ending(
        run_id=ids[3], run_error=None, ended_at=clock.now_iso(), signal_id=ids[0], signal_error=None,
        signal_error_if_cancelled="cancelled",
    )
    assert await claim(second, ids[5], ending) == (False, ids[4])
    assert await state(ids[1]) == ("pending", [])
    assert await state(ids[0]) == ("done", ["done"])  # the ends were written all the same
    assert len(await ledger(store)) == 2
    # Nor one cancelled since it was read.
    oldest = await signal_queries.oldest_pending(store)
    assert oldest is not None and oldest.signal.id == ids[4]
    async with store.transaction() as conn:
        assert await signal_queries.cancel(conn, id=ids[4], error="cancelled") is not None
    assert await claim(oldest, ids[5]) == (False, ids[1])
    assert await state(ids[4]) == ("failed", [])
    # Each of those refusals drew the number predicted and appended nothing: the next claim alone
    # still predicts the tree (it would otherwise miss once, and claim nothing).
    second = await signal_queries.oldest_pending(store)
    assert second is not None and second.signal.id == ids[1]
    assert await claim(second, ids[5]) == (True, ids[2])
    assert [entry.get("run") for entry in await ledger(store)] == [None, ids[3], ids[5]]
    # Not when another process appended to the ledger since this one's last entry: its prediction fails.
    other = Store(store.url)
    try:
        await Ledger(other).record_instructions({"handlers": ["changed"]})
    finally:
        await other.close()
    third = await signal_queries.oldest_pending(store)
    assert third is not None and third.signal.id == ids[2]
    assert await claim(third, ids[6]) == (False, None)  # its draw was not the one predicted
    assert await state(ids[2]) == ("pending", [])
    # The claim in a transaction then reads the tree and goes on from it, gap-free.
    async with store.transaction() as conn:
        claimed = await signal_queries.claim_oldest(conn)
        assert claimed is not None and claimed.id == ids[2]
        record = run_queries.to_record(signal_id=ids[2], prompts=[(ids[6], "s", "p")], first_started_at=clock.now_iso())
        await ledger_.started(conn, claimed, record[:1], record[0].started_at, record)  # type: ignore[arg-type]
    assert [entry.get("run") for entry in await ledger(store)] == [None, ids[3], ids[5], None, ids[6]]
    # And the next claim alone predicts the tree again.
    async with store.transaction() as conn:
        await signal_queries.insert(conn, id=ids[7], kind="k", payload={}, emitted_at=_later(now, 40))
    fourth = await signal_queries.oldest_pending(store)
    assert fourth is not None and fourth.signal.id == ids[7]
    assert await claim(fourth, ids[8]) == (True, None)
    assert len(await ledger(store)) == 6
