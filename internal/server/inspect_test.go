package server

import (
	"flag"
)

var update = flag.Bool("update", false, "rewrite golden files under testdata/ and the generated part of docs/configuration.md")
