import sys

from keras_vit.cli import main

sys.exit(main())
