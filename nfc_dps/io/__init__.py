"""Reading and writing images and result files.

* :mod:`.images`: image files (read_image, write_image, encode_image, quantize, ImageInfo);
* :mod:`.tiff`: the TIFFs Pillow cannot read as they are, and float-TIFF measurements (write_measurement);
* :mod:`.files`: atomic writes and records (atomic_write_bytes / _text, write_json, write_csv,
  remove_stale_temp_files);
* :mod:`.folders`: folder listing (list_folder, scan_images, unusable_reason, ...).
"""

from .files import (
    TEMP_SUFFIX,
    atomic_write_bytes,
    atomic_write_text,
    remove_stale_temp_files,
    write_csv,
    write_json,
)
from .folders import images_in_subfolders, list_folder, list_images, scan_images, unusable_reason
from .images import (
    IMAGE_EXTENSIONS,
    INTEGER_SCALES,
    ImageInfo,
    ImageReadError,
    encode_image,
    image_opens,
    quantize,
    read_image,
    write_image,
)
from .tiff import write_measurement

__all__ = [
    "IMAGE_EXTENSIONS", "ImageReadError", "ImageInfo", "read_image", "write_image", "list_images",
    "list_folder", "unusable_reason", "atomic_write_bytes", "atomic_write_text", "write_json", "write_csv",
    "remove_stale_temp_files", "TEMP_SUFFIX", "quantize", "image_opens", "write_measurement", "images_in_subfolders",
    "scan_images", "INTEGER_SCALES", "encode_image",
]
