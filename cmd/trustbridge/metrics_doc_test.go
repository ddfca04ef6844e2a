package main

import (
	"regexp"
)

// rowRe finds the metric names in docs/metrics.md's table.
var rowRe = regexp.MustCompile("(?m)^\\| `(trustbridge_\\w+)` \\|")
