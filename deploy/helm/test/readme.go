package helmtest

import (
	"bytes"
	"errors"
	"fmt"
	"strings"

	yaml "go.yaml.in/yaml/v3"
)

// The chart README's values section lies between these markers;
// TestChartReadme checks it and, with -update, rewrites it.
const (
	readmeBegin = "<!-- values: generated from values.yaml by `go test -run TestChartReadme -update` in deploy/helm/test; edit values.yaml, not this section -->"
	readmeEnd   = "<!-- end of values -->"
)

// valueDoc is one documented value: a leaf of values.yaml (a scalar, a
// list or an empty map), or a map whose comment introduces its values.
type valueDoc struct {
	path    string
	def     string // the default, in YAML flow style; empty for a map
	comment []string
}

// valuesDocs reads values.yaml with its comments (the comment block right
// above a key is that key's) and returns every leaf and every commented
// map, in file order.
func valuesDocs(values []byte) ([]valueDoc, error) {
	var doc yaml.Node
	if err := yaml.Unmarshal(values, &doc); err != nil {
		return nil, fmt.Errorf("values.yaml: %w", err)
	}
	if len(doc.Content) != 1 || doc.Content[0].Kind != yaml.MappingNode {
		return nil, errors.New("values.yaml: want a map at the top")
	}
	var out []valueDoc
	if err := walkValues(doc.Content[0], "", &out); err != nil {
		return nil, err
	}
	return out, nil
}

func walkValues(m *yaml.Node, prefix string, out *[]valueDoc) error {
	for i := 0; i+1 < len(m.Content); i += 2 {
		k, v := m.Content[i], m.Content[i+1]
		d := valueDoc{path: prefix + k.Value, comment: commentLines(k.HeadComment, k.LineComment, v.LineComment)}
		if v.Kind == yaml.MappingNode && len(v.Content) > 0 {
			if len(d.comment) > 0 {
				*out = append(*out, d)
			}
			if err := walkValues(v, d.path+".", out); err != nil {
				return err
			}
			continue
		}
		def, err := flowYAML(v)
		if err != nil {
			return fmt.Errorf("values.yaml: %s: %w", d.path, err)
		}
		d.def = def
		*out = append(*out, d)
	}
	return nil
}

// commentLines strips the comment markers: "# text" gives "text", and
// lines indented further ("#   - x: 1") keep their extra indentation.
func commentLines(comments ...string) []string {
	var lines []string
	for _, c := range comments {
		if c == "" {
			continue
		}
		for l := range strings.SplitSeq(c, "\n") {
			l = strings.TrimPrefix(strings.TrimSpace(l), "#")
			lines = append(lines, strings.TrimPrefix(l, " "))
		}
	}
	return lines
}

// flowYAML is a value as one line of YAML: "", 30s, [443, 8443], {}.
func flowYAML(v *yaml.Node) (string, error) {
	if v.Kind == yaml.ScalarNode {
		if v.Tag == "!!str" && v.Value == "" {
			return `""`, nil
		}
		if v.Tag == "!!null" {
			return "null", nil
		}
		return v.Value, nil
	}
	c := *v
	c.Style = yaml.FlowStyle
	c.HeadComment, c.LineComment, c.FootComment = "", "", ""
	b, err := yaml.Marshal(&c)
	if err != nil {
		return "", err
	}
	return strings.TrimSpace(string(b)), nil
}

// valuesMarkdown renders the docs as a Markdown list: each value's path,
// its default and its comment; comment lines indented further (examples)
// become a YAML code block.
func valuesMarkdown(docs []valueDoc) string {
	var b strings.Builder
	for _, d := range docs {
		b.WriteString("- **`" + d.path + "`**")
		if d.def != "" {
			b.WriteString(" (default `" + d.def + "`)")
		}
		text, examples := splitExamples(d.comment)
		if text != "" {
			b.WriteString(": " + escapeMarkdown(text))
		}
		b.WriteString("\n")
		for _, ex := range examples {
			b.WriteString("\n  ```yaml\n")
			for _, l := range ex {
				b.WriteString("  " + l + "\n")
			}
			b.WriteString("  ```\n\n")
		}
	}
	return b.String()
}

// splitExamples joins a comment's prose lines into one paragraph and
// returns its indented blocks apart, dedented.
func splitExamples(lines []string) (string, [][]string) {
	var prose []string
	var examples [][]string
	inExample := false
	for _, l := range lines {
		if strings.HasPrefix(l, "  ") {
			if !inExample {
				examples = append(examples, nil)
				inExample = true
			}
			examples[len(examples)-1] = append(examples[len(examples)-1], l)
			continue
		}
		inExample = false
		if l = strings.TrimSpace(l); l != "" {
			prose = append(prose, l)
		}
	}
	for i, ex := range examples {
		examples[i] = dedent(ex)
	}
	return strings.Join(prose, " "), examples
}

func dedent(lines []string) []string {
	indent := -1
	for _, l := range lines {
		n := len(l) - len(strings.TrimLeft(l, " "))
		if indent < 0 || n < indent {
			indent = n
		}
	}
	out := make([]string, len(lines))
	for i, l := range lines {
		out[i] = l[indent:]
	}
	return out
}

// escapeMarkdown keeps comment text literal in Markdown outside `code`
// spans: <name> would be an HTML tag, * emphasis. (After an unmatched
// backtick the rest is left as written.)
func escapeMarkdown(s string) string {
	r := strings.NewReplacer(`\`, `\\`, "<", `\<`, "*", `\*`)
	parts := strings.Split(s, "`")
	for i := 0; i < len(parts); i += 2 { // even parts are outside code spans
		parts[i] = r.Replace(parts[i])
	}
	return strings.Join(parts, "`")
}

// spliceReadme replaces the values section of a README with section.
func spliceReadme(readme []byte, section string) ([]byte, error) {
	begin := bytes.Index(readme, []byte(readmeBegin))
	end := bytes.Index(readme, []byte(readmeEnd))
	if begin < 0 || end < begin {
		return nil, fmt.Errorf("README: want the markers %q and %q, in that order, around the values section", readmeBegin, readmeEnd)
	}
	var b bytes.Buffer
	b.Write(readme[:begin+len(readmeBegin)])
	b.WriteString("\n\n" + section + "\n")
	b.Write(readme[end:])
	return b.Bytes(), nil
}
