package statusui

import (
	"io"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/net/html"
)

// dom is a parsed page with the queries the tests need.
type dom struct{ root *html.Node }

func parseDOM(t testing.TB, r io.Reader) dom {
	t.Helper()
	n, err := html.Parse(r)
	require.NoError(t, err)
	return dom{n}
}

func (d dom) walk(f func(*html.Node)) {
	var rec func(*html.Node)
	rec = func(n *html.Node) {
		f(n)
		for c := n.FirstChild; c != nil; c = c.NextSibling {
			rec(c)
		}
	}
	rec(d.root)
}

// elements returns the elements named tag ("" for all).
func (d dom) elements(tag string) []*html.Node {
	var out []*html.Node
	d.walk(func(n *html.Node) {
		if n.Type == html.ElementNode && (tag == "" || n.Data == tag) {
			out = append(out, n)
		}
	})
	return out
}

func (d dom) byID(id string) *html.Node {
	for _, n := range d.elements("") {
		if attr(n, "id") == id {
			return n
		}
	}
	return nil
}

// withClass returns the elements whose class list holds class.
func (d dom) withClass(class string) []*html.Node {
	var out []*html.Node
	for _, n := range d.elements("") {
		if hasClass(n, class) {
			out = append(out, n)
		}
	}
	return out
}

func hasClass(n *html.Node, class string) bool {
	for _, c := range strings.Fields(attr(n, "class")) {
		if c == class {
			return true
		}
	}
	return false
}

func attr(n *html.Node, key string) string {
	for _, a := range n.Attr {
		if a.Key == key {
			return a.Val
		}
	}
	return ""
}

func text(n *html.Node) string {
	var b strings.Builder
	var rec func(*html.Node)
	rec = func(n *html.Node) {
		if n.Type == html.TextNode {
			b.WriteString(n.Data)
		}
		for c := n.FirstChild; c != nil; c = c.NextSibling {
			rec(c)
		}
	}
	rec(n)
	return b.String()
}

// assertInert checks that nothing in the document can run or fetch: no
// script, no element that loads a resource or a frame, no event handler
// attribute, no link, and exactly the page's own two SVGs.
func assertInert(t *testing.T, d dom) {
	t.Helper()
	for _, n := range d.elements("") {
		switch n.Data {
		case "script", "img", "iframe", "object", "embed", "link", "base", "form", "input", "foreignObject", "image", "use", "a", "audio", "video", "source", "meta":
			if n.Data == "meta" && (attr(n, "charset") != "" || attr(n, "name") != "") {
				continue
			}
			t.Errorf("unexpected <%s> element: %v", n.Data, n.Attr)
		}
		for _, a := range n.Attr {
			k := strings.ToLower(a.Key)
			if strings.HasPrefix(k, "on") || k == "href" || k == "src" || k == "srcdoc" || k == "xlink:href" || k == "style" || k == "formaction" {
				t.Errorf("unexpected attribute %s=%q on <%s>", a.Key, a.Val, n.Data)
			}
		}
	}
	if got := len(d.elements("svg")); got != 2 {
		t.Errorf("want the page's 2 svg elements, got %d", got)
	}
	if got := len(d.elements("style")); got != 1 {
		t.Errorf("want the page's 1 style element, got %d", got)
	}
}

// parseDOMNode queries the subtree under n.
func parseDOMNode(n *html.Node) dom { return dom{n} }
