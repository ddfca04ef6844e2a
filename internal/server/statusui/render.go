package statusui

import (
	_ "embed"
	"html/template"
	"io"
	"strings"
)

//go:embed page.html
var pageSource string

var pageTemplate = template.Must(template.New("page").Funcs(template.FuncMap{
	"num":      num,
	"sub":      func(a, b float64) float64 { return a - b },
	"add":      func(a, b float64) float64 { return a + b },
	"segments": segments,
}).Parse(pageSource))

func render(w io.Writer, p page) error {
	return pageTemplate.Execute(w, p)
}

// segments cuts a SPIFFE ID, URL or path pattern after each "/", so the
// page offers a line break between path segments (<wbr>) and a long ID
// wraps there rather than in the middle of a word; a table cell breaks
// inside a segment only when the segment alone is wider than the cell.
// The scheme's "//" stays whole: "spiffe://td/a/b" is "spiffe://td/",
// "a/", "b".
func segments(s string) []string {
	head := ""
	if i := strings.Index(s, "://"); i >= 0 {
		head, s = s[:i+3], s[i+3:]
	}
	parts := strings.SplitAfter(s, "/")
	parts[0] = head + parts[0]
	return parts
}
