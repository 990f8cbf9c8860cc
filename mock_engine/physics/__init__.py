"""The mock engine's serving physics: a pure continuous-batching core over simulated seconds.

    profile = load_profile("h100-13b-fp16")          # or "tiny", or a path to a YAML file
    core = PhysicsCore(profile)                      # implements mock_engine.core.EngineCore
    core.submit(EngineRequest("r1", text, estimate_tokens(text), 128, arrival_s=now_s))
    events = core.advance(now_s)                     # tokens emitted up to now_s
    wake_s = core.next_event_s()                     # when to call advance again

Modules: `tokens` (token estimate, chained prefix-block hashes), `profile` (dataclasses and the
memory/time formulas), `loader` (YAML), `kv_cache` (blocks and prefix cache), `sequence` (per-request
state), `scheduler` (planning a step), `engine` (the step loop), `calibration` (measured decode table
vs targets).
"""

from mock_engine.physics.calibration import CalibrationRow, calibrate, render_calibration_markdown
from mock_engine.physics.engine import PhysicsCore, RequestTooLargeError
from mock_engine.physics.kv_cache import KvBlockPool
from mock_engine.physics.loader import DEFAULT_PROFILE_NAME, available_profiles, load_profile, parse_profile
from mock_engine.physics.profile import (
    CalibrationTarget,
    DecodeSpec,
    EngineProfile,
    GpuSpec,
    ModelGeometry,
    PrefillSpec,
    ProfileError,
    SchedulerSpec,
)
from mock_engine.physics.tokens import (
    CHARS_PER_TOKEN,
    estimate_tokens,
    prefix_block_hashes,
    split_prefix_blocks,
)

__all__ = [
    "CHARS_PER_TOKEN",
    "DEFAULT_PROFILE_NAME",
    "CalibrationRow",
    "CalibrationTarget",
    "DecodeSpec",
    "EngineProfile",
    "GpuSpec",
    "KvBlockPool",
    "ModelGeometry",
    "PhysicsCore",
    "PrefillSpec",
    "ProfileError",
    "RequestTooLargeError",
    "SchedulerSpec",
    "available_profiles",
    "calibrate",
    "estimate_tokens",
    "load_profile",
    "parse_profile",
    "prefix_block_hashes",
    "render_calibration_markdown",
    "split_prefix_blocks",
]
