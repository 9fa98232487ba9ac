"""Fragmentation arithmetic on CUDA caching-allocator snapshots. Pure Python.

Input is the list of segment dicts that ``torch.cuda.memory_snapshot()`` (or
``torch.cuda.memory._snapshot()["segments"]``) returns: each segment has
``total_size``, ``stream``, ``segment_type``, ``segment_pool_id``,
``is_expandable`` and ``blocks``; each block has ``size``,
``requested_size`` and ``state``. Nothing here imports torch, so the CPU tests
replay snapshots recorded on a GPU.

Every metric is defined in docs/sanitizer-memory.md; the names here match.
The numbers come only from the snapshot's blocks, never from the allocator's
split counters, because those read 0 under ``expandable_segments`` while the
snapshot still lists every block.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, List, Mapping, Optional, Tuple

MiB = 1 << 20
# Requests up to this size are served from the small pool (c10 kSmallSize).
SMALL_POOL_MAX_REQUEST = 1 * MiB

HARD = "hard"
SOFT = "soft"
STREAM = "stream"
CATEGORIES = (HARD, SOFT, STREAM)

FRAGMENTATION = "fragmentation"
EXHAUSTION = "exhaustion"


def format_bytes(n: Optional[int]) -> str:
    if n is None:
        return "unknown"
    n = int(n)
    if abs(n) < 1024:
        return f"{n} B"
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(n) >= size:
            return f"{n / size:.2f} {unit}"
    return f"{n} B"  # pragma: no cover - unreachable


def _ratio(numerator: float, denominator: float) -> float:
    return numerator / denominator if denominator > 0 else 0.0


@dataclass
class PoolMetrics:
    """Totals over one pool (one stream's segments of one type), or over all.

    ``allocated`` counts blocks the program holds; ``awaiting_free`` counts
    blocks it has freed that wait on another stream's events (``record_stream``);
    ``total_free`` counts inactive blocks, the memory a new request can reuse.
    """

    stream: Optional[int] = None
    pool: str = "all"
    segments: int = 0
    expandable_segments: int = 0
    reserved: int = 0
    allocated: int = 0
    requested: int = 0
    awaiting_free: int = 0
    total_free: int = 0
    largest_free: int = 0
    free_blocks: int = 0
    free_sum_of_squares: int = 0
    fully_free_segments: int = 0
    fully_free_bytes: int = 0
    interleaved_free_bytes: int = 0

    @property
    def slack(self) -> float:
        """(reserved − allocated) / reserved."""
        return _ratio(self.reserved - self.allocated, self.reserved)

    @property
    def external_fragmentation(self) -> float:
        """1 − largest free block / total free; 0 when nothing is free."""
        return 1.0 - _ratio(self.largest_free, self.total_free) if self.total_free > 0 else 0.0

    @property
    def asawicki(self) -> float:
        """1 − sqrt(Σ fᵢ²) / Σ fᵢ over the free blocks fᵢ."""
        if self.total_free <= 0:
            return 0.0
        value = 1.0 - math.sqrt(self.free_sum_of_squares) / self.total_free
        return min(1.0, max(0.0, value))

    @property
    def internal_free(self) -> int:
        """Rounding waste inside allocated blocks: Σ (size − requested_size)."""
        return max(0, self.allocated - self.requested)

    @property
    def external_free(self) -> int:
        """Free gaps between and around blocks (the inactive blocks)."""
        return self.total_free

    @property
    def utilisation(self) -> float:
        """Σ allocated / Σ reserved, the snapshot utilisation of #29554."""
        return _ratio(self.allocated, self.reserved)

    def merge(self, other: "PoolMetrics") -> None:
        self.segments += other.segments
        self.expandable_segments += other.expandable_segments
        self.reserved += other.reserved
        self.allocated += other.allocated
        self.requested += other.requested
        self.awaiting_free += other.awaiting_free
        self.total_free += other.total_free
        self.largest_free = max(self.largest_free, other.largest_free)
        self.free_blocks += other.free_blocks
        self.free_sum_of_squares += other.free_sum_of_squares
        self.fully_free_segments += other.fully_free_segments
        self.fully_free_bytes += other.fully_free_bytes
        self.interleaved_free_bytes += other.interleaved_free_bytes

    def to_json(self) -> Dict[str, Any]:
        return {
            "stream": self.stream,
            "pool": self.pool,
            "segments": self.segments,
            "expandable_segments": self.expandable_segments,
            "reserved_bytes": self.reserved,
            "allocated_bytes": self.allocated,
            "requested_bytes": self.requested,
            "awaiting_free_bytes": self.awaiting_free,
            "total_free_bytes": self.total_free,
            "largest_free_block_bytes": self.largest_free,
            "free_blocks": self.free_blocks,
            "internal_free_bytes": self.internal_free,
            "external_free_bytes": self.external_free,
            "fully_free_segments": self.fully_free_segments,
            "fully_free_bytes": self.fully_free_bytes,
            "interleaved_free_bytes": self.interleaved_free_bytes,
            "slack": round(self.slack, 4),
            "external_fragmentation": round(self.external_fragmentation, 4),
            "asawicki": round(self.asawicki, 4),
            "utilisation": round(self.utilisation, 4),
        }


def _pool_name(segment: Mapping[str, Any]) -> str:
    kind = str(segment.get("segment_type", "large"))
    pool_id = segment.get("segment_pool_id")
    if pool_id and any(pool_id):
        # A private pool: CUDA graphs or torch.cuda.MemPool.
        return f"{kind}:pool{tuple(pool_id)}"
    return kind


def _block_state(block: Mapping[str, Any]) -> str:
    state = str(block.get("state", ""))
    if state == "active_allocated":
        return "allocated"
    if state == "inactive":
        return "free"
    # "active_awaiting_free" and any later "active_*" variant: freed by the
    # program, still held for another stream. Neither usable nor the user's.
    return "awaiting"


def segment_metrics(segment: Mapping[str, Any]) -> PoolMetrics:
    """The metrics of one segment."""
    metrics = PoolMetrics(stream=int(segment.get("stream", 0)), pool=_pool_name(segment))
    metrics.segments = 1
    metrics.expandable_segments = 1 if segment.get("is_expandable") else 0
    total = int(segment.get("total_size", 0))
    metrics.reserved = total
    blocks = segment.get("blocks")
    if blocks:
        for block in blocks:
            size = int(block.get("size", 0))
            state = _block_state(block)
            if state == "allocated":
                metrics.allocated += size
                # requested_size of an inactive block is stale: count it only here.
                metrics.requested += min(size, int(block.get("requested_size", size)))
            elif state == "free":
                if size <= 0:
                    continue
                metrics.total_free += size
                metrics.free_blocks += 1
                metrics.largest_free = max(metrics.largest_free, size)
                metrics.free_sum_of_squares += size * size
            else:
                metrics.awaiting_free += size
    else:
        # A snapshot without blocks: all that is known is the segment's totals,
        # so its free part is counted as one block.
        metrics.allocated = int(segment.get("allocated_size", 0))
        metrics.requested = min(metrics.allocated, int(segment.get("requested_size", metrics.allocated)))
        active = int(segment.get("active_size", metrics.allocated))
        metrics.awaiting_free = max(0, active - metrics.allocated)
        free = max(0, total - active)
        if free:
            metrics.total_free = free
            metrics.free_blocks = 1
            metrics.largest_free = free
            metrics.free_sum_of_squares = free * free
    if metrics.allocated == 0 and metrics.awaiting_free == 0:
        metrics.fully_free_segments = 1
        metrics.fully_free_bytes = metrics.total_free
    else:
        metrics.interleaved_free_bytes = metrics.total_free
    return metrics


@dataclass
class SnapshotMetrics:
    """Per-pool and overall metrics of one snapshot, and its classification.

    ``free_by_category`` partitions the free bytes: ``stream`` is free memory
    in the pools of streams other than the main stream (the one holding the
    most allocated memory); of the main stream's free memory, ``soft`` lies in
    fully free segments and ``hard`` in segments that also hold live blocks.
    """

    overall: PoolMetrics
    pools: List[PoolMetrics]
    main_stream: Optional[int]
    free_by_category: Dict[str, int]
    expandable: bool

    @property
    def parked_in_other_streams(self) -> int:
        return self.free_by_category[STREAM]

    @property
    def category(self) -> Optional[str]:
        """The category holding the most free bytes; None when nothing is free."""
        if self.overall.total_free <= 0:
            return None
        return max(CATEGORIES, key=lambda name: (self.free_by_category[name], -CATEGORIES.index(name)))

    def pools_for(self, stream: Optional[int], large: bool) -> List[PoolMetrics]:
        """The default pools a request on ``stream`` can be served from."""
        wanted = "large" if large else "small"
        return [p for p in self.pools if p.pool == wanted and (stream is None or p.stream == stream)]

    def to_json(self) -> Dict[str, Any]:
        return {
            "overall": self.overall.to_json(),
            "pools": [p.to_json() for p in self.pools],
            "main_stream": self.main_stream,
            "free_by_category": dict(self.free_by_category),
            "category": self.category,
            "parked_in_other_streams_bytes": self.parked_in_other_streams,
            "expandable_segments": self.expandable,
        }


def analyze(segments: Iterable[Mapping[str, Any]]) -> SnapshotMetrics:
    """Metrics per (stream, pool) and overall for a snapshot's segments."""
    pools: Dict[Tuple[Optional[int], str], PoolMetrics] = {}
    per_segment: List[PoolMetrics] = []
    for segment in segments:
        metrics = segment_metrics(segment)
        per_segment.append(metrics)
        key = (metrics.stream, metrics.pool)
        if key not in pools:
            pools[key] = PoolMetrics(stream=metrics.stream, pool=metrics.pool)
        pools[key].merge(metrics)
    overall = PoolMetrics()
    for metrics in pools.values():
        overall.merge(metrics)

    allocated_by_stream: Dict[int, int] = {}
    for metrics in per_segment:
        stream = metrics.stream if metrics.stream is not None else 0  # a segment's metrics always name it
        allocated_by_stream[stream] = allocated_by_stream.get(stream, 0) + metrics.allocated + metrics.awaiting_free
    main_stream: Optional[int] = None
    if allocated_by_stream:
        # The stream holding the most live memory; ties go to the default stream (0).
        main_stream = max(allocated_by_stream, key=lambda s: (allocated_by_stream[s], s == 0, -s))

    categories = {HARD: 0, SOFT: 0, STREAM: 0}
    for metrics in per_segment:
        if metrics.stream != main_stream:
            categories[STREAM] += metrics.total_free
        else:
            categories[SOFT] += metrics.fully_free_bytes
            categories[HARD] += metrics.interleaved_free_bytes
    ordered = sorted(pools.values(), key=lambda p: (p.stream != main_stream, p.stream, p.pool))
    return SnapshotMetrics(
        overall=overall,
        pools=ordered,
        main_stream=main_stream,
        free_by_category=categories,
        expandable=overall.expandable_segments > 0,
    )


# ---------------------------------------------------------------- judgement


@dataclass(frozen=True)
class Thresholds:
    """When a snapshot's state is worth a finding (docs/sanitizer-memory.md).

    The floors keep small tests and the allocator's ordinary caching quiet:
    a clean loop leaves its freed activations in a few large free blocks.
    """

    min_free_bytes: int = 64 * MiB
    min_free_fraction: float = 0.25
    min_external_fragmentation: float = 0.75
    min_free_blocks: int = 8


@dataclass
class FragmentationVerdict:
    category: str
    severity: str
    free_bytes: int
    reason: str


def judge(
    metrics: SnapshotMetrics, *, under_pressure: bool = False, thresholds: Thresholds = Thresholds()
) -> Optional[FragmentationVerdict]:
    """Whether the snapshot shows fragmentation worth reporting, and which kind.

    Hard fragmentation (free gaps between live blocks, which only freeing the
    live blocks can merge) is always reported above the thresholds. Soft
    fragmentation (fully free segments) and stream fragmentation (free memory
    parked in other streams' pools) are the cache working as designed until
    memory runs short, so they are reported only ``under_pressure``: after an
    allocation retry, an OOM, or with reserved memory near the cap.
    """
    overall = metrics.overall
    if overall.reserved <= 0:
        return None
    free_fraction = _ratio(overall.total_free, overall.reserved)

    def big_enough(nbytes: int) -> bool:
        return nbytes >= thresholds.min_free_bytes and _ratio(nbytes, overall.reserved) >= thresholds.min_free_fraction

    if not big_enough(overall.total_free):
        return None
    hard = metrics.free_by_category[HARD]
    main_pools = [p for p in metrics.pools if p.stream == metrics.main_stream]
    main = PoolMetrics()
    for pool in main_pools:
        main.merge(pool)
    if (
        big_enough(hard)
        and main.external_fragmentation >= thresholds.min_external_fragmentation
        and main.free_blocks >= thresholds.min_free_blocks
    ):
        return FragmentationVerdict(
            HARD,
            "warning",
            hard,
            f"{format_bytes(hard)} free in gaps between live blocks; largest free block "
            f"{format_bytes(main.largest_free)} (external fragmentation {main.external_fragmentation:.2f})",
        )
    if not under_pressure:
        return None
    stream = metrics.free_by_category[STREAM]
    soft = metrics.free_by_category[SOFT]
    if big_enough(stream) and stream >= soft:
        return FragmentationVerdict(
            STREAM,
            "warning",
            stream,
            f"{format_bytes(stream)} free memory parked in other streams' pools while memory ran short",
        )
    if big_enough(soft):
        return FragmentationVerdict(
            SOFT,
            "warning",
            soft,
            f"{format_bytes(soft)} in {main.fully_free_segments} fully free segments while memory ran short "
            f"(slack {overall.slack:.2f}, free {free_fraction:.0%} of reserved)",
        )
    return None


# ---------------------------------------------------------------- OOM verdict


def parse_alloc_conf(text: Optional[str]) -> Dict[str, str]:
    """``"expandable_segments:True,max_split_size_mb:128"`` -> ordered dict."""
    options: Dict[str, str] = {}
    for part in (text or "").split(","):
        part = part.strip()
        if not part:
            continue
        key, _, value = part.partition(":")
        options[key.strip()] = value.strip()
    return options


def format_alloc_conf(options: Mapping[str, str]) -> str:
    return ",".join(f"{key}:{value}" for key, value in options.items())


def suggest_alloc_conf(current: Optional[str], *, expandable: bool, cause: str) -> Tuple[Optional[str], List[str]]:
    """The ``PYTORCH_ALLOC_CONF`` to try next, and the further options to try.

    Keeps the user's other options. ``expandable_segments:True`` first (it
    fixed the measured reproduction), then ``garbage_collection_threshold``,
    and ``max_split_size_mb`` only as a last resort. Nothing for true
    exhaustion: no allocator setting makes more memory.
    """
    options = parse_alloc_conf(current)
    if cause != FRAGMENTATION:
        return None, []
    if options.get("backend", "native") == "cudaMallocAsync":
        return None, ["backend:native with expandable_segments:True (cudaMallocAsync does its own pooling)"]
    already_expandable = expandable or options.get("expandable_segments", "").lower() == "true"
    alternatives: List[str] = []
    options["expandable_segments"] = "True"
    if not already_expandable:
        if "garbage_collection_threshold" not in options:
            alternatives.append(format_alloc_conf({**options, "garbage_collection_threshold": "0.8"}))
    elif "garbage_collection_threshold" not in options:
        # Expandable segments are on already: reclaim cached blocks earlier.
        options["garbage_collection_threshold"] = "0.8"
    alternatives.append("max_split_size_mb:<MB> as a last resort (stops large cached blocks from being split)")
    return format_alloc_conf(options), alternatives


@dataclass
class OomVerdict:
    """Why an allocation failed: fragmentation or true exhaustion."""

    cause: str
    subtype: Optional[str]
    requested: int
    reserved: int
    allocated: int
    free_cached: int
    largest_free: Optional[int]
    total_free: Optional[int]
    eligible_largest_free: Optional[int]
    cap: Optional[int] = None
    device_free: Optional[int] = None
    process_used: Optional[int] = None
    other_processes_used: Optional[int] = None
    expandable: bool = False
    suggested_alloc_conf: Optional[str] = None
    alternatives: List[str] = field(default_factory=list)

    @property
    def non_pytorch_bytes(self) -> Optional[int]:
        """Memory this process holds outside the allocator (context, cuBLAS, NCCL)."""
        if self.process_used is None:
            return None
        return max(0, self.process_used - self.reserved)

    def message(self) -> str:
        request = format_bytes(self.requested)
        if self.cause == FRAGMENTATION:
            where = {
                "external": "no free block is large enough",
                "stream": "the free memory sits in other streams' pools",
                "pool": "the free memory sits in pools this request cannot use",
                "awaiting_free": "the free memory is held for other streams (record_stream)",
            }.get(self.subtype or "", "no free block is large enough")
            return (
                f"CUDA out of memory from fragmentation: {request} requested while "
                f"{format_bytes(self.free_cached)} was reserved but unallocated; {where} "
                f"(largest free block {format_bytes(self.largest_free)})"
            )
        text = (
            f"CUDA out of memory (exhaustion): {request} requested, only "
            f"{format_bytes(self.free_cached)} reserved but unallocated"
        )
        if self.cap is not None:
            text += f", {format_bytes(self.reserved)} of the {format_bytes(self.cap)} cap reserved"
        return text

    def fix_hint(self) -> str:
        if self.cause == FRAGMENTATION:
            hint = (
                f"set PYTORCH_ALLOC_CONF={self.suggested_alloc_conf}"
                if self.suggested_alloc_conf
                else "reduce fragmentation"
            )
            if not self.expandable and self.subtype == "external":
                hint += "; empty_cache() does not merge blocks that live tensors split"
            if self.subtype == "stream":
                hint += "; allocate and free on one stream, or synchronize before reusing freed side-stream memory"
            return hint
        parts = ["reduce peak memory (smaller batch, activation checkpointing, free tensors earlier)"]
        if self.other_processes_used:
            parts.append(f"other processes hold {format_bytes(self.other_processes_used)} on this GPU")
        return "; ".join(parts)

    def to_json(self) -> Dict[str, Any]:
        return {
            "cause": self.cause,
            "subtype": self.subtype,
            "requested_bytes": self.requested,
            "reserved_bytes": self.reserved,
            "allocated_bytes": self.allocated,
            "free_cached_bytes": self.free_cached,
            "largest_free_block_bytes": self.largest_free,
            "total_free_bytes": self.total_free,
            "eligible_largest_free_block_bytes": self.eligible_largest_free,
            "cap_bytes": self.cap,
            "device_free_bytes": self.device_free,
            "process_used_bytes": self.process_used,
            "non_pytorch_bytes": self.non_pytorch_bytes,
            "other_processes_bytes": self.other_processes_used,
            "expandable_segments": self.expandable,
            "suggested_alloc_conf": self.suggested_alloc_conf,
            "alternatives": list(self.alternatives),
        }


def oom_verdict(
    requested: int,
    reserved: int,
    allocated: int,
    metrics: Optional[SnapshotMetrics] = None,
    *,
    stream: Optional[int] = None,
    cap: Optional[int] = None,
    device_free: Optional[int] = None,
    process_used: Optional[int] = None,
    other_processes_used: Optional[int] = None,
    current_conf: Optional[str] = None,
    expandable: Optional[bool] = None,
) -> OomVerdict:
    """Fragmentation when the request fits in the free cached memory
    (reserved − allocated) but no free block can hold it; exhaustion otherwise.

    ``reserved``/``allocated`` come from the allocator's stats, ``metrics``
    from a snapshot taken at the same moment (inside the OOM observer, after
    the allocator's own flush-and-retry). ``stream`` is the allocating stream,
    when known: a request is served only from its own stream's pool.
    """
    free_cached = max(0, reserved - allocated)
    is_expandable = bool(expandable) if expandable is not None else bool(metrics and metrics.expandable)
    largest = total = eligible_largest = None
    subtype: Optional[str] = None
    if requested <= free_cached:
        cause = FRAGMENTATION
        subtype = "external"
        if metrics is not None:
            largest = metrics.overall.largest_free
            total = metrics.overall.total_free
            large = requested > SMALL_POOL_MAX_REQUEST
            eligible = metrics.pools_for(stream, large)
            eligible_largest = max((p.largest_free for p in eligible), default=0)
            eligible_total = sum(p.total_free for p in eligible)
            own_kind_total = sum(p.total_free for p in metrics.pools_for(None, large))
            if eligible_largest < requested <= eligible_total:
                subtype = "external"
            elif requested <= own_kind_total:
                subtype = "stream"
            elif requested <= total:
                subtype = "pool"
            else:
                subtype = "awaiting_free"
    else:
        cause = EXHAUSTION
        if metrics is not None:
            largest = metrics.overall.largest_free
            total = metrics.overall.total_free
    suggested, alternatives = suggest_alloc_conf(current_conf, expandable=is_expandable, cause=cause)
    return OomVerdict(
        cause=cause,
        subtype=subtype,
        requested=int(requested),
        reserved=int(reserved),
        allocated=int(allocated),
        free_cached=free_cached,
        largest_free=largest,
        total_free=total,
        eligible_largest_free=eligible_largest,
        cap=cap,
        device_free=device_free,
        process_used=process_used,
        other_processes_used=other_processes_used,
        expandable=is_expandable,
        suggested_alloc_conf=suggested,
        alternatives=alternatives,
    )


# ---------------------------------------------------------------- a new segment, judged as it is mapped


@dataclass
class NewSegmentWaste:
    """A segment the allocator mapped while its pool already held enough free cached memory.

    ``request`` is the largest live block of the new segment (the rounded
    request that most likely made the allocator map it); ``pool_free`` and
    ``pool_largest_free`` are the free memory of the same stream's same pool
    in the segments that existed before. Enough free memory in total, but no
    free block large enough: the cache is fragmented, and this request paid
    for it with a new segment.
    """

    address: int
    stream: int
    pool: str
    segment_bytes: int
    request: int
    pool_free: int
    pool_largest_free: int
    pool_segments: int

    def message(self) -> str:
        return (
            f"a new {format_bytes(self.segment_bytes)} segment was mapped for a {format_bytes(self.request)} "
            f"request while {format_bytes(self.pool_free)} lay free in {self.pool_segments} cached segment(s) of the "
            f"same pool and stream (largest free block {format_bytes(self.pool_largest_free)}): "
            "the free memory is in gaps between live blocks"
        )

    def to_json(self) -> Dict[str, Any]:
        return {
            "segment_address": hex(self.address),
            "stream": self.stream,
            "pool": self.pool,
            "segment_bytes": self.segment_bytes,
            "request_bytes": self.request,
            "pool_free_bytes": self.pool_free,
            "pool_largest_free_block_bytes": self.pool_largest_free,
            "pool_segments": self.pool_segments,
        }


def new_segment_waste(segments: List[Mapping[str, Any]], known: Iterable[int]) -> List[NewSegmentWaste]:
    """The segments of a snapshot not in ``known`` (addresses) that were mapped although free memory sufficed."""
    known = set(known)
    pools: Dict[Tuple[Optional[int], str], PoolMetrics] = {}
    fresh = []
    for segment in segments:
        metrics = segment_metrics(segment)
        if int(segment.get("address", 0)) in known:
            key = (metrics.stream, metrics.pool)
            pools.setdefault(key, PoolMetrics(stream=metrics.stream, pool=metrics.pool)).merge(metrics)
        else:
            fresh.append((segment, metrics))
    wasted = []
    for segment, metrics in fresh:
        request = max(
            (int(b.get("size", 0)) for b in segment.get("blocks") or () if _block_state(b) == "allocated"),
            default=metrics.allocated,
        )
        pool = pools.get((metrics.stream, metrics.pool))
        if not request or pool is None or pool.total_free < request or pool.largest_free >= request:
            # Not enough free memory (a new segment was needed), or a free block
            # that fits (the allocator had another reason: not fragmentation).
            continue
        wasted.append(
            NewSegmentWaste(
                address=int(segment.get("address", 0)),
                stream=int(segment.get("stream", 0)),
                pool=metrics.pool,
                segment_bytes=metrics.reserved,
                request=request,
                pool_free=pool.total_free,
                pool_largest_free=pool.largest_free,
                pool_segments=pool.segments,
            )
        )
    return wasted
