"""``python -m nbtrain.examples model DIR`` / ``data FILE``: the tiny model and the addition data (see the
package's doc)."""

from nbtrain.examples import main

raise SystemExit(main())
