"""The markdown table of a bench/long_restore.py report (GB = 10^9 bytes)."""

from __future__ import annotations

from typing import Any

CONTENDERS = (
    ("lmcache_adp", "lmcache-adp (gateway, O_DIRECT)"),
    ("lmcache_adp_config", "lmcache-adp, gateway config"),
    ("lmcache_adp_shm_copy", "lmcache-adp, L1 in shared memory, copy path (zero_copy: false)"),
    ("lmcache_adp_shm", "lmcache-adp, L1 in shared memory"),
    ("fs_native", "LMCache fs_native (O_DIRECT)"),
    ("ram_l2", "LMCache fs_native on tmpfs (L2 at memory speed: LMCache's own cost)"),
)


def markdown(report: dict[str, Any]) -> str:
    results = report["results"]
    floor_s = results["floor"]["read_s"]
    prompt = report["prompt"]
    lines = [
        f"`{report['command']}` — commit {report['commit']}, {report['date_utc']} UTC, "
        f"KV cache on {report['mode']}, L1 {report['l1_size_gb']} GiB, host's shmem huge pages: "
        f"{report.get('shmem_huge_pages', 'not recorded')}",
        "",
        _prompt_line(prompt, report["target"]),
        "",
        "| what | restore s | LOOKUP + L2 prefetch s | RETRIEVE s | GB/s | / disk floor "
        "| again, L1 cleared: restore s (prefetch s) | store s (+ L2 settle s) | data equal |",
        "|---|---|---|---|---|---|---|---|---|",
        _floor_row(results["floor"], prompt["bytes"]),
    ]
    for key, label in CONTENDERS:
        if key in results:
            lines.append(_row(label, results[key], floor_s))
    return "\n".join(lines) + "\n"


def _prompt_line(prompt: dict[str, Any], target: dict[str, Any]) -> str:
    shape = f"{prompt['layers']} layers x 2 x {prompt['kv_heads']} heads x {prompt['head_dim']}"
    return (
        f"Prompt: {prompt['tokens']:,} tokens x {prompt['bytes'] // prompt['tokens']:,} bytes"
        f" (KV of {shape}, bfloat16) = {prompt['bytes'] / 1e9:.2f} GB in"
        f" {prompt['tokens'] // 256} chunks of 256 tokens; target {target['bytes'] / 1e9:.2f} GB"
        f" ({target['tokens']:,} tokens x {target['bytes_per_token']:,} bytes)."
    )


def _floor_row(floor: dict[str, Any], prompt_bytes: int) -> str:
    shape = f"{floor['read_threads']} threads x {floor['read_io_bytes'] // 2**20} MiB"
    return (
        f"| disk floor: O_DIRECT read ({shape}) | {floor['read_s']:.2f} | | | "
        f"{floor['read_GBps']:.2f} | 1.00 | | write {floor['write_GBps']:.2f} GB/s | |"
    )


def _row(label: str, result: dict[str, Any], floor_s: float) -> str:
    if "failed" in result:
        return f"| {label} | failed: {result['failed'][-150:].replace('|', '/')} | | | | | | | |"
    store, restore = result["store"], result["restore"]
    if result.get("config"):
        label += " `" + "; ".join(result["config"].strip().splitlines()) + "`"
    if result.get("zero_copy_ops"):
        label += f"; {result['zero_copy_ops']} stores zero-copy"
    equal = restore["ok"] and restore["digest_matches_store"]
    settle = store["l2_settle_after_store_s"]
    again = restore.get("again")  # reports before the second restore have none
    twice = f"{again['restore_s']:.2f} ({again['lookup_prefetch_s']:.2f})" if again else ""
    return (
        f"| {label} | {restore['restore_s']:.2f} | {restore['lookup_prefetch_s']:.2f} "
        f"| {restore['retrieve_s']:.2f} | {restore['bytes'] / restore['restore_s'] / 1e9:.2f} "
        f"| {restore['restore_s'] / floor_s:.2f} | {twice} "
        f"| {store['store_s']:.2f} (+ {settle:.2f}) "
        f"| {'yes' if equal else 'NO'} ({restore['hits']}/{restore['chunks']} chunks) |"
    )
