# SPDX-License-Identifier: MIT
"""Helpers of Client.publish_batch that need pyarrow (an optional dependency, imported
only here and only when needed)."""
from __future__ import annotations

from typing import Any, Optional


def _plain(t: Any, pa: Any) -> Any:
    """t with every view type replaced by its large non-view form (recursively)."""
    if pa.types.is_string_view(t):
        return pa.large_string()
    if pa.types.is_binary_view(t):
        return pa.large_binary()
    if pa.types.is_list_view(t) or pa.types.is_large_list_view(t):
        return pa.large_list(t.value_field.with_type(_plain(t.value_type, pa)))
    if pa.types.is_large_list(t):
        return pa.large_list(t.value_field.with_type(_plain(t.value_type, pa)))
    if pa.types.is_fixed_size_list(t):
        return pa.list_(t.value_field.with_type(_plain(t.value_type, pa)), t.list_size)
    if pa.types.is_map(t):
        return pa.map_(t.key_field.with_type(_plain(t.key_type, pa)), t.item_field.with_type(_plain(t.item_type, pa)),
                       t.keys_sorted)
    if pa.types.is_list(t):
        return pa.list_(t.value_field.with_type(_plain(t.value_type, pa)))
    if pa.types.is_struct(t):
        return pa.struct([t.field(i).with_type(_plain(t.field(i).type, pa)) for i in range(t.num_fields)])
    if pa.types.is_dictionary(t):
        return pa.dictionary(t.index_type, _plain(t.value_type, pa), t.ordered)
    return t


def without_views(obj: Any) -> Optional[Any]:
    """obj's Arrow data with string/binary views and list views cast (by pyarrow, one more
    copy) to large strings, binaries and lists, which libshmref stores; None when pyarrow
    is missing or obj has no view type (nothing to retry with)."""
    try:
        import pyarrow as pa
    except ImportError:
        return None
    if hasattr(obj, "__arrow_c_stream__"):
        data = pa.RecordBatchReader.from_stream(obj).read_all()
    elif hasattr(obj, "__arrow_c_array__"):
        data = pa.array(obj)
    else:
        return None
    if isinstance(data, pa.Table):
        schema = pa.schema([f.with_type(_plain(f.type, pa)) for f in data.schema], data.schema.metadata)
        return None if schema.equals(data.schema) else data.cast(schema)
    plain = _plain(data.type, pa)
    return None if plain.equals(data.type) else data.cast(plain)
