"""Typed configuration shared by the dataset stages.

Defaults follow the reference environment of PROTOCOL.md; every value can be
overridden from CLI flags, a TOML file or ``TRAJFORGE_*`` environment variables,
and the resolved settings are written into each run's manifest.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from transforms.schemas import ACTIONS

#: ``action_map`` target of platform actions that are no part of a trajectory (e.g. favorite)
DROP_ACTION = "drop"

#: Documented key for the generated sample only. Real logs must set their own
#: (``TRAJFORGE_REKEY_KEY``): whoever holds the key can re-link lake ids to platform ids.
SAMPLE_REKEY_KEY = "trajforge-sample-key"


class Geometry(BaseModel):
    """Screen geometry in CSS px (PROTOCOL.md §1, reference values). Sizes and offsets may be
    fractional; scroll distances are the protocol's whole pixels."""

    screen_width: float = 402
    screen_height: float = 874
    feed_viewport: float = 693  # visible feed height
    ipv_viewport: float = 837  # visible detail-page height
    max_feed_scroll: int = 694  # largest scroll_down / scroll_up distance
    max_ipv_scroll: int = 837  # largest ipv scroll distance
    visible_fraction: float = 0.5  # share of a card's height that must be in view
    default_card_height: float = Field(328, gt=0, description="a logged card box without height")
    default_card_width: float = Field(196.5, gt=0, description="a logged card box without width")


class IngestSettings(BaseSettings):
    """How raw log bundles become lake tables."""

    model_config = SettingsConfigDict(env_prefix="TRAJFORGE_", env_nested_delimiter="__")

    rekey_key: str = Field(SAMPLE_REKEY_KEY, repr=False)
    buckets: int = Field(4, ge=1, le=4096, description="user-hash partitions of steps/sessions/feed_layouts")
    geometry: Geometry = Geometry()
    action_map: dict[str, str] = Field(
        default_factory=dict,
        description=f"platform action name -> one of the 13 actions, or {DROP_ACTION!r}: an event "
        "that is no part of the trajectory (left out without cutting its session, counted as dropped)",
    )
    on_bad_event: Literal["cut", "drop_session"] = Field(
        "cut",
        description="a rejected event inside a session: cut the session after its last good step, "
        "or quarantine the whole session",
    )
    keep_image_refs: bool = Field(
        False, description="keep raw image refs; by default they are keyed like ids (they often embed ids)"
    )
    spill_part_rows: int = Field(
        750_000,
        ge=1,
        description="feed + event rows per ingest part (bounds memory; 1 part for small bundles)",
    )
    memory_rows: int = Field(
        8_000_000,
        ge=0,
        description="feed + event rows up to which the parts stay in memory (about 1 GiB); "
        "larger bundles spill their parts to disk between the two passes",
    )
    max_quarantined_share: float = Field(
        0.5,
        ge=0,
        le=1,
        description="the gate stops a stage that quarantines more than this share of any input table's rows",
    )
    keep_landed: bool = Field(
        True,
        description="keep the bundle's rows as read beside the lake (LAKE/_landed, the bundle's own ids), "
        "so that a bundle grown by new files is ingested from those files alone",
    )
    split_seed: int = 42
    split_ratios: tuple[float, float, float] = (0.8, 0.1, 0.1)
    zstd_level: int = 1  # zstd's fast end: ingest is write-heavy, the lake is read-many
    timestamp_unit: str = Field("auto", description="epoch unit of numeric timestamps: auto | s | ms | us")

    @field_validator("action_map")
    @classmethod
    def _maps_to_actions(cls, action_map: dict[str, str]) -> dict[str, str]:
        unknown = sorted({v for v in action_map.values() if v not in (*ACTIONS, DROP_ACTION)})
        if unknown:
            raise ValueError(f"action_map targets: each one of the 13 actions or {DROP_ACTION!r}: {unknown}")
        return action_map
