package statusui

import (
	_ "embed"
	"html/template"
	"io"
)

//go:embed page.html
var pageSource string

var pageTemplate = template.Must(template.New("page").Funcs(template.FuncMap{
	"num": num,
	"sub": func(a, b float64) float64 { return a - b },
	"add": func(a, b float64) float64 { return a + b },
}).Parse(pageSource))

func render(w io.Writer, p page) error {
	return pageTemplate.Execute(w, p)
}
