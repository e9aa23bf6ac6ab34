r"""
Where fitted lenses are kept: one folder per model, named by the checksum of
its weights (:func:`~captum_iglens.hf.checksum.weights_checksum`), under the
model cache's root (:func:`~captum_iglens.hf.model_files.cache_root`,
``lenses/<checksum>/``), like the embedded models' verified cache.
"""

from pathlib import Path
from typing import Any, Optional


def lens_cache_folder(checksum: str, cache_dir: Optional[Any] = None) -> Path:
    r"""
    The folder of the cached fitted lens of the model with ``checksum``.

    Args:

        checksum (str): From
                    :func:`~captum_iglens.hf.checksum.weights_checksum`.
        cache_dir (str or Path, optional): The cache root, as in
                    :func:`~captum_iglens.hf.models.load_embedded`. Default: None
                    (``$CAPTUM_IGLENS_CACHE``, else the user cache).

    Returns:
        *Path* ``<root>/lenses/<first 16 hex digits>`` (it may not exist yet).
    """
    from captum_iglens.hf.model_files import cache_root

    return cache_root(cache_dir) / "lenses" / checksum[:16]
