import sys

from captum_iglens.cli import main

sys.exit(main())
