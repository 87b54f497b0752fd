"""The one writer: every file keras_vit writes, renames or removes goes through this package.

- `keras_vit.writer.ownership` decides, reading only: ownership markers and
  digests, identity of paths, private names, a claim's checks.
- `keras_vit.writer.files` writes: the claim (`claim`, `Destination`), a
  file replaced in one step (`atomic_write`), a directory built under a
  private name and swapped in, the cleanup of abandoned staging.

It imports only `keras_vit.utils` of keras_vit, so every package above can
write through it.
"""
