"""The one lookup behind every seam (minicb/core/registry.py): a registered name gives what
it registered; a missing one gives the one error every seam raises, naming the seam, the
name, the setting that asked, what is registered and the import that registers it."""

import pytest

from minicb.core.registry import FeatureNotLoaded, lookup


def test_a_registered_name_gives_its_entry_and_a_missing_one_says_what_to_import():
    formats = {"auto": "plain", "fp8": "eight bits"}
    assert lookup(formats, "KV format", "fp8", "kv_cache_dtype='fp8'") == "eight bits"
    with pytest.raises(FeatureNotLoaded) as caught:
        lookup(formats, "KV format", "int8", "kv_cache_dtype='int8'")
    err = caught.value
    assert isinstance(err, ValueError)  # shown wherever an invalid setting is shown
    assert (err.seam, err.name) == ("KV format", "int8")
    assert str(err) == (
        "kv_cache_dtype='int8' asks for the 'int8' KV format, which is not registered "
        "(registered: auto, fp8). Optional features register when their package is "
        "imported: import minicb.features first (import minicb does it)"
    )
    with pytest.raises(FeatureNotLoaded, match=r"\(registered: none\)"):
        lookup({}, "drafter", "ngram", "speculative='ngram'")
