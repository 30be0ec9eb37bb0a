"""Reading and writing images and result files (see :mod:`nfc_dps.io.images`)."""

from .images import (
    IMAGE_EXTENSIONS,
    INTEGER_SCALES,
    TEMP_SUFFIX,
    ImageInfo,
    ImageReadError,
    atomic_write_bytes,
    atomic_write_text,
    encode_image,
    image_opens,
    images_in_subfolders,
    list_folder,
    list_images,
    quantize,
    read_image,
    remove_stale_temp_files,
    scan_images,
    unusable_reason,
    write_csv,
    write_image,
    write_json,
)
from .images import __all__
