"""Run in the peer venv: openpi-client's own resize_with_pad (PIL) on each image of an .npz,
the results saved to another .npz (what robotd's letterboxing is compared with).

    python openpi_peer_resize.py IN.npz OUT.npz HEIGHT WIDTH
"""

import sys

import numpy as np
from openpi_client.image_tools import resize_with_pad

images = np.load(sys.argv[1])
height, width = int(sys.argv[3]), int(sys.argv[4])
np.savez(sys.argv[2], **{k: resize_with_pad(images[k], height, width) for k in images.files})
