"""The hash-chain picture of lesson 06 draws one key per full block, equal keys in one colour."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

from paged_kv_lib.prefix_cache import chain_keys  # noqa: E402
from paged_kv_lib.viz.hash_chain import plot_hash_chain  # noqa: E402


def _key_patches(fig):
    ax = fig.axes[0]
    texts = [t.get_text() for t in ax.texts if t.get_text().startswith("key ")]
    return texts


def test_one_key_per_full_block_and_shared_prefixes_share_keys():
    prompts = [[1, 2, 3, 4, 5, 6, 7, 8, 9], [1, 2, 3, 4, 5, 6, 7, 8], [9, 9, 9, 9, 5, 6, 7, 8]]
    fig = plot_hash_chain(prompts, 4)
    shown = _key_patches(fig)
    expected = [f"key {k.hex()[:6]}" for p in prompts for k in chain_keys(p, 4)]
    assert shown == expected
    assert shown[0] == shown[2] and shown[1] == shown[3]  # prompts 0 and 1 share both keys
    assert shown[5] != shown[1]  # the same tokens after another prefix: another key
    assert any("partial block" in t.get_text() for t in fig.axes[0].texts)
    plt.close(fig)


def test_bad_arguments():
    with pytest.raises(ValueError):
        plot_hash_chain([[1, 2]], 0)
    with pytest.raises(ValueError):
        plot_hash_chain([], 4)
