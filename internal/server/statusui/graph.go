package statusui

import (
	"fmt"

	"github.com/trustbridge/trustbridge/internal/server/api"
)

// Graph geometry, in SVG user units. The local trust domain sits in the
// middle; federated and file-sourced trust domains stand in two columns,
// left and right, in snapshot order (sorted by name), so the layout is
// the same for the same snapshot and edge labels never cross.
const (
	graphWidth   = 1200.0
	graphMargin  = 24.0
	graphNodeW   = 300.0
	graphNodeH   = 50.0
	graphLocalW  = 280.0
	graphLocalH  = 72.0
	graphRowStep = 66.0
	graphMinH    = 190.0
	graphNameMax = 30
)

type graph struct {
	Width, Height float64
	Local         graphNode
	Nodes         []graphNode
	Edges         []graphEdge
}

type graphNode struct {
	X, Y, W, H float64
	// Name is shown (maybe shortened); Full is the tooltip.
	Name, Full string
	Sub        string
	Class      string
	// TextX is where the labels inside the box start (the local node's
	// are centred on it).
	TextX float64
}

type graphEdge struct {
	Path   string
	Class  string
	Dashed bool
	// Label sits just above the edge's end at the remote node.
	LabelX, LabelY float64
	Anchor         string
	Label          string
}

// layoutGraph lays out the trust graph: the local trust domain in the
// middle, the others in two columns with an edge to each.
func layoutGraph(s api.Snapshot) graph {
	var remote []api.TrustDomain
	localName := s.TrustDomain
	for _, td := range s.TrustDomains {
		if td.Local {
			localName = td.Name
			continue
		}
		remote = append(remote, td)
	}
	// Left column takes the first half; one trust domain alone goes right.
	nLeft := len(remote) / 2
	left, right := remote[:nLeft], remote[nLeft:]
	rows := max(len(left), len(right))
	g := graph{Width: graphWidth, Height: max(graphMinH, float64(rows)*graphRowStep+2*graphMargin)}
	cy := g.Height / 2
	g.Local = graphNode{
		X: (graphWidth - graphLocalW) / 2, Y: cy - graphLocalH/2, W: graphLocalW, H: graphLocalH,
		Name: truncate(localName, graphNameMax), Full: localName, Class: "local",
		TextX: graphWidth / 2,
	}
	switch n := len(remote); n {
	case 0:
		g.Local.Sub = "no federated trust domains"
	case 1:
		g.Local.Sub = "trusts 1 other trust domain"
	default:
		g.Local.Sub = fmt.Sprintf("trusts %d other trust domains", n)
	}
	g.placeColumn(left, cy, true)
	g.placeColumn(right, cy, false)
	return g
}

// placeColumn stacks the nodes of one column around the local node's
// centre line cy, each with its edge from the local node.
func (g *graph) placeColumn(col []api.TrustDomain, cy float64, isLeft bool) {
	for i, td := range col {
		y := cy + (float64(i)-float64(len(col)-1)/2)*graphRowStep
		node, edge := g.remote(td, y, cy, isLeft)
		g.Nodes = append(g.Nodes, node)
		g.Edges = append(g.Edges, edge)
	}
}

// remote lays out the node of td centred on y, in the left or right
// column, and the edge to it from the local node, whose centre is at cy.
func (g *graph) remote(td api.TrustDomain, y, cy float64, isLeft bool) (graphNode, graphEdge) {
	node := graphNode{Y: y - graphNodeH/2, W: graphNodeW, H: graphNodeH, Name: truncate(td.Name, graphNameMax), Full: td.Name}
	_, node.Class = tdState(td)
	node.Sub = nodeSub(td)
	// Labels go on the side of the edge's end away from the curve.
	edge := graphEdge{Class: node.Class, Label: edgeLabel(td), LabelY: y - 7}
	if y > cy+1 {
		edge.LabelY = y + 17
	}
	edge.Dashed = td.Federation == nil
	var x1, x2 float64 // local side, remote side
	if isLeft {
		node.X = graphMargin
		node.TextX = node.X + 14
		x1, x2 = g.Local.X, node.X+node.W
		edge.LabelX, edge.Anchor = x2+14, "start"
	} else {
		node.X = graphWidth - graphMargin - graphNodeW
		node.TextX = node.X + 14
		x1, x2 = g.Local.X+g.Local.W, node.X
		edge.LabelX, edge.Anchor = x2-14, "end"
	}
	// The arrow needs a few units of straight line before the node.
	tip := x2
	if isLeft {
		tip += 2
	} else {
		tip -= 2
	}
	mid := (x1 + tip) / 2
	edge.Path = fmt.Sprintf("M%s %s C%s %s %s %s %s %s", num(x1), num(cy), num(mid), num(cy), num(mid), num(y), num(tip), num(y))
	return node, edge
}

func nodeSub(td api.TrustDomain) string {
	state, _ := tdState(td)
	if f := td.Federation; f != nil {
		sub := state
		if f.ConsecutiveFailures > 0 {
			sub += fmt.Sprintf(" · %d failed polls", f.ConsecutiveFailures)
		}
		if td.Sequence != nil {
			sub += fmt.Sprintf(" · seq %d", *td.Sequence)
		}
		return truncate(sub+" · "+plural(len(td.Authorities), "authority", "authorities"), 48)
	}
	return truncate("static · "+plural(len(td.Authorities), "authority", "authorities"), 48)
}

func edgeLabel(td api.TrustDomain) string {
	if f := td.Federation; f != nil {
		if f.Profile == "" {
			return "bundle endpoint"
		}
		return truncate(f.Profile, 24)
	}
	return "bundle file"
}

func plural(n int, one, many string) string {
	if n == 1 {
		return "1 " + one
	}
	return fmt.Sprintf("%d %s", n, many)
}
