package main

import (
	"regexp"
)

var (
	optsRe = regexp.MustCompile(`(?s)prometheus\.New(Counter|Gauge|Histogram|Summary)(Vec|Func)?\(prometheus\.\w+Opts\{\s*Name:\s*"(trustbridge_\w+)",\s*Help:\s*"((?:[^"\\]|\\.)*)",`)
	descRe = regexp.MustCompile(`(?s)prometheus\.NewDesc\("(trustbridge_\w+)",\s*"((?:[^"\\]|\\.)*)",\s*\[\]string\{([^}]*)\}`)
	vecRe  = regexp.MustCompile(`(?s)^.*?\},\s*\[\]string\{([^}]*)\}\)`)
	constL = regexp.MustCompile(`(?s)^[^}]*ConstLabels:\s*prometheus\.Labels\{"(\w+)"`)
	rowRe  = regexp.MustCompile("(?m)^\\| `(trustbridge_\\w+)` \\|")
)
