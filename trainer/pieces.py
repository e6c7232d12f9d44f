"""The fixed pieces of a gold response, whole tokens of the tiny tokenizer (no imports: the settings
and the GPU-side trainer both read them)."""

#: the fixed pieces of a response, ``{"rationale":"...","action":{"type":"...", ...}}`` (PROTOCOL §2):
#: as single tokens a tiny model cannot misspell them, and an action name cannot be stitched from the
#: pieces of two others (a byte-level pre-tokenizer splits ``ipv_scroll_down`` at each underscore)
RESPONSE_PIECES = (
    '{"rationale":"',
    '","action":{"type":"',
    '","target":"',
    '","target_item_id":"',
    '","distance":',
    '"}}',
    "}}",
)
#: the same pieces when the records write the action first (``PromptSettings.response_order``)
ACTION_FIRST_PIECES = ('{"action":{"type":"', '"},"rationale":"', '},"rationale":"', '"}')
