"""The markdown tables of a bench/long_restore.py report (GB = 10^9 bytes): the restore's times,
and the CPU seconds of each process in the store and in the restore."""

from __future__ import annotations

import re
from typing import Any

from bench import odirect

CONTENDERS = (
    ("lmcache_adp", "lmcache-adp (gateway, O_DIRECT)"),
    ("lmcache_adp_config", "lmcache-adp, gateway config"),
    ("lmcache_adp_shm_copy", "lmcache-adp, L1 in shared memory, copy path (zero_copy: false)"),
    ("lmcache_adp_shm", "lmcache-adp, L1 in shared memory"),
    ("fs_native", "LMCache fs_native (O_DIRECT)"),
    ("ram_l2", "LMCache fs_native on tmpfs (L2 at memory speed: LMCache's own cost)"),
)
DATABASES_KEY = re.compile(r"lmcache_adp_(\d+)db")
PROCESSES = (("server", "lmcache server"), ("gateway", "gateway"), ("client", "client"))


def markdown(report: dict[str, Any]) -> str:
    results = report["results"]
    floor = results.get("floor")  # a run cut short may lack the floor and the set-up's record
    floor_s = floor.get("read_s") if floor else None
    references = [k for k in ("fs_native", "ram_l2") if _restore_s(results.get(k))]
    lines = []
    if "mode" in report:
        lines += [
            f"KV cache on {report['mode']}, L1 {report['l1_size_gb']} GiB, host's shmem huge "
            f"pages: {report.get('shmem_huge_pages', 'not recorded')}.",
            "",
        ]
    if "prompt" in report:
        lines += [_prompt_line(report["prompt"], report["target"]), ""]
    checks = report.get("odirect", [])
    if checks:
        lines += [*(f"- {odirect.line(check)}" for check in checks), ""]
    lines += [
        "| what | restore s | LOOKUP + L2 prefetch s | RETRIEVE s | GB/s | / disk floor "
        + "".join(f"| / {_short(k)} " for k in references)
        + "| again, L1 cleared: restore s (prefetch s) | store s (+ L2 settle s) | data equal |",
        "|---|---|---|---|---|---|" + "---|" * len(references) + "---|---|---|",
    ]
    if floor:
        lines.append(_floor_row(floor, len(references)))
    for key, label in contenders(results):
        lines.append(_row(label, results[key], floor_s, [results[k] for k in references]))
    cpu = cpu_table(results)
    if cpu:
        lines += ["", *cpu]
    return "\n".join(lines) + "\n"


def contenders(results: dict[str, Any]) -> list[tuple[str, str]]:
    """(key, label) of every contender in the results, in the table's order: ours with one
    database, ours with more, then the others."""
    counts = sorted(int(m[1]) for k in results if (m := DATABASES_KEY.fullmatch(k)))
    found = [(k, label) for k, label in CONTENDERS if k in results]
    more = [(f"lmcache_adp_{n}db", f"lmcache-adp, {n} databases (gateway)") for n in counts]
    return found[:1] + more + found[1:] if found[:1] == [CONTENDERS[0]] else more + found


def cpu_table(results: dict[str, Any]) -> list[str]:
    """CPU seconds of each process, and per GB of the prompt, in the store and the restore
    (nothing for reports from before they were read)."""
    names = [label for _, label in PROCESSES]
    rows = [_cpu_row(label, results[key]) for key, label in contenders(results)]
    if not any(rows):
        return []
    return [
        "CPU seconds of each process (per GB of the prompt): the store from the STORE call until "
        "the write-through to L2 settled (the client until its STORE returned), the restore over "
        "LOOKUP + RETRIEVE; user + system, every thread (/proc/PID/stat).",
        "",
        f"| what | store: {' | '.join(names)} | all | restore: {' | '.join(names)} | all |",
        "|---|" + "---|" * (2 * len(names) + 2),
        *(row for row in rows if row),
    ]


def _cpu_row(label: str, result: dict[str, Any]) -> str:
    if "failed" in result or "cpu_s" not in result["store"]:
        return ""
    row = [label]
    for phase in ("store", "restore"):
        cpu, gigabytes = result[phase]["cpu_s"], result[phase]["bytes"] / 1e9
        row += [_cpu(cpu.get(name), gigabytes) for name, _ in PROCESSES]
        row.append(_cpu(sum(cpu.values()), gigabytes))
    return "| " + " | ".join(row) + " |"


def _cpu(seconds: float | None, gigabytes: float) -> str:
    return "-" if seconds is None else f"{seconds:.2f} ({seconds / gigabytes:.2f}/GB)"


def _short(key: str) -> str:
    return {"fs_native": "fs_native", "ram_l2": "LMCache alone (tmpfs L2)"}[key]


def _restore_s(result: dict[str, Any] | None) -> float | None:
    if not result or "failed" in result:
        return None
    return float(result["restore"]["restore_s"])


def _prompt_line(prompt: dict[str, Any], target: dict[str, Any]) -> str:
    shape = f"{prompt['layers']} layers x 2 x {prompt['kv_heads']} heads x {prompt['head_dim']}"
    return (
        f"Prompt: {prompt['tokens']:,} tokens x {prompt['bytes'] // prompt['tokens']:,} bytes"
        f" (KV of {shape}, bfloat16) = {prompt['bytes'] / 1e9:.2f} GB in"
        f" {prompt['tokens'] // 256} chunks of 256 tokens; target {target['bytes'] / 1e9:.2f} GB"
        f" ({target['tokens']:,} tokens x {target['bytes_per_token']:,} bytes)."
    )


def _floor_row(floor: dict[str, Any], references: int) -> str:
    blanks = "| " * references
    if "skipped" in floor:
        return f"| disk floor: not measured ({floor['skipped']}) | | | | | {blanks}| | | | |"
    shape = f"{floor['read_threads']} threads x {floor['read_io_bytes'] // 2**20} MiB"
    return (
        f"| disk floor: O_DIRECT read ({shape}) | {floor['read_s']:.2f} | | | "
        f"{floor['read_GBps']:.2f} | 1.00 {blanks}| | write {floor['write_GBps']:.2f} GB/s | |"
    )


def _row(
    label: str, result: dict[str, Any], floor_s: float | None, references: list[dict[str, Any]]
) -> str:
    blanks = "| " * len(references)
    if "failed" in result:
        why = result["failed"][-150:].replace("|", "/")
        return f"| {label} | failed: {why} | | | | {blanks}| | | | |"
    store, restore = result["store"], result["restore"]
    if result.get("config"):
        label += " `" + "; ".join(result["config"].strip().splitlines()) + "`"
    if result.get("zero_copy_ops"):
        label += f"; {result['zero_copy_ops']} stores zero-copy"
    equal = restore["ok"] and restore["digest_matches_store"]
    settle = store["l2_settle_after_store_s"]
    again = restore.get("again")  # reports before the second restore have none
    twice = f"{again['restore_s']:.2f} ({again['lookup_prefetch_s']:.2f})" if again else ""
    seconds = restore["restore_s"]
    ratios = [_ratio(seconds, floor_s)] + [_ratio(seconds, _restore_s(r)) for r in references]
    return (
        f"| {label} | {seconds:.2f} | {restore['lookup_prefetch_s']:.2f} "
        f"| {restore['retrieve_s']:.2f} | {restore['bytes'] / seconds / 1e9:.2f} "
        f"| {' | '.join(ratios)} | {twice} "
        f"| {store['store_s']:.2f} (+ {settle:.2f}) "
        f"| {'yes' if equal else 'NO'} ({restore['hits']}/{restore['chunks']} chunks) |"
    )


def _ratio(top: float, bottom: float | None) -> str:
    return "-" if not bottom else f"{top / bottom:.2f}"
