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

// segments cuts a SPIFFE ID, URL or path pattern after its scheme's
// "://" and after each "/". The page sets each in an inline block (.seg)
// with a <wbr> between, so a long ID wraps between segments, never at a
// hyphen or mid-word inside one; a segment breaks inside only when it
// alone is wider than the cell. "spiffe://td/a/b" is "spiffe://", "td/", "a/", "b".
func segments(s string) []string {
	head := ""
	if i := strings.Index(s, "://"); i >= 0 {
		head, s = s[:i+3], s[i+3:]
	}
	parts := strings.SplitAfter(s, "/")
	if head != "" {
		parts = append([]string{head}, parts...)
	}
	return parts
}
