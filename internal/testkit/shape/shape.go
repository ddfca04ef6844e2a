// Package shape measures the shape of the house (issue 33, STYLE.md "Shape
// of the house"): how big package main is, how many functions are too long
// or too complex, how many names package ca exports, how many folders
// internal/ has, and whether anything in internal/ outside the compositions
// (the server's, the agent's) imports a domain package. TestHouseShape holds
// the repository to its ceilings and logs what each measure counts (make
// shape).
package shape

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"
)

// Module is the main module's path.
const Module = "github.com/trustbridge/trustbridge"

// The limits a function is measured against.
const (
	MaxFuncLines      = 60
	MaxFuncComplexity = 15
)

// domains are the domain packages nothing in internal/ but the server's
// composition imports.
var domains = []string{"bundleserver", "federation", "ca", "sds"}

// Measures is what Measure found.
type Measures struct {
	// MainLines counts the non-test lines of package main in cmd/trustbridge.
	MainLines int
	// LongFuncs and ComplexFuncs name the non-test functions of the main
	// module over MaxFuncLines lines and over MaxFuncComplexity cyclomatic
	// complexity (gocyclo's rules), as "file:func (n)".
	LongFuncs, ComplexFuncs []string
	// CAExported names what package ca (its own directory) exports:
	// functions, methods, types, variables and constants, not struct fields.
	CAExported []string
	// InternalFolders are the top-level folders of internal/.
	InternalFolders []string
	// UpArrows are imports of a domain package from internal/, outside
	// the compositions (internal/server, internal/agent), as
	// "dir -> package".
	UpArrows []string
}

// Measure walks the main module at root (its go.mod's directory), skipping
// bin/, testdata/, hidden folders and nested modules.
func Measure(root string) (*Measures, error) {
	w := &walker{fset: token.NewFileSet(), ca: map[string]bool{}, up: map[string]bool{}}
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		rel = filepath.ToSlash(rel)
		if d.IsDir() {
			return skipDir(p, rel, d.Name())
		}
		if !strings.HasSuffix(rel, ".go") || strings.HasSuffix(rel, "_test.go") {
			return nil
		}
		return w.file(p, rel)
	})
	if err != nil {
		return nil, err
	}
	ents, err := os.ReadDir(filepath.Join(root, "internal"))
	if err != nil {
		return nil, err
	}
	for _, e := range ents {
		if e.IsDir() {
			w.m.InternalFolders = append(w.m.InternalFolders, e.Name())
		}
	}
	w.m.CAExported, w.m.UpArrows = sorted(w.ca), sorted(w.up)
	sort.Strings(w.m.LongFuncs)
	sort.Strings(w.m.ComplexFuncs)
	return &w.m, nil
}

// skipDir tells WalkDir to pass over what is not the main module's source:
// bin/, testdata/, hidden folders and nested modules.
func skipDir(p, rel, name string) error {
	if rel != "." && (name == "bin" || name == "testdata" || strings.HasPrefix(name, ".") || exists(filepath.Join(p, "go.mod"))) {
		return filepath.SkipDir
	}
	return nil
}

// walker accumulates the measures file by file.
type walker struct {
	fset *token.FileSet
	m    Measures
	ca   map[string]bool // ca's exported names
	up   map[string]bool // "dir -> package" arrows
}

// file measures one non-test Go file, rel its slash path from the root.
func (w *walker) file(p, rel string) error {
	f, err := parser.ParseFile(w.fset, p, nil, 0)
	if err != nil {
		return err
	}
	dir := path.Dir(rel)
	if dir == "cmd/trustbridge" {
		w.m.MainLines += w.fset.File(f.Pos()).LineCount()
	}
	if dir == "ca" {
		for _, n := range exported(f) {
			w.ca[n] = true
		}
	}
	if strings.HasPrefix(dir, "internal/") && !composition(dir) {
		for _, a := range domainImports(f) {
			w.up[dir+" -> "+a] = true
		}
	}
	for _, d := range f.Decls {
		if fn, ok := d.(*ast.FuncDecl); ok && fn.Body != nil {
			w.function(rel, fn)
		}
	}
	return nil
}

// function records fn if it is over either limit.
func (w *walker) function(rel string, fn *ast.FuncDecl) {
	name := rel + ":" + funcName(fn)
	if l := w.fset.Position(fn.End()).Line - w.fset.Position(fn.Pos()).Line + 1; l > MaxFuncLines {
		w.m.LongFuncs = append(w.m.LongFuncs, fmt.Sprintf("%s (%d lines)", name, l))
	}
	if c := Complexity(fn); c > MaxFuncComplexity {
		w.m.ComplexFuncs = append(w.m.ComplexFuncs, fmt.Sprintf("%s (complexity %d)", name, c))
	}
}

// Complexity is fn's cyclomatic complexity as gocyclo counts it: 1, plus
// one per if, for, range, non-default case or select clause, && and ||.
func Complexity(fn *ast.FuncDecl) int {
	c := 1
	ast.Inspect(fn, func(n ast.Node) bool {
		switch x := n.(type) {
		case *ast.IfStmt, *ast.ForStmt, *ast.RangeStmt:
			c++
		case *ast.CaseClause:
			if x.List != nil {
				c++
			}
		case *ast.CommClause:
			if x.Comm != nil {
				c++
			}
		case *ast.BinaryExpr:
			if x.Op == token.LAND || x.Op == token.LOR {
				c++
			}
		}
		return true
	})
	return c
}

// exported lists the exported functions, methods (Type.Name), types,
// variables and constants f declares.
func exported(f *ast.File) []string {
	var out []string
	for _, d := range f.Decls {
		switch x := d.(type) {
		case *ast.FuncDecl:
			if x.Name.IsExported() {
				out = append(out, funcName(x))
			}
		case *ast.GenDecl:
			for _, s := range x.Specs {
				switch sp := s.(type) {
				case *ast.TypeSpec:
					if sp.Name.IsExported() {
						out = append(out, sp.Name.Name)
					}
				case *ast.ValueSpec:
					for _, n := range sp.Names {
						if n.IsExported() {
							out = append(out, n.Name)
						}
					}
				}
			}
		}
	}
	return out
}

// compositions are the packages that compose domain packages into a
// process: the server (and its own features beneath it) and the node agent.
var compositions = []string{"internal/server", "internal/agent"}

func composition(dir string) bool {
	for _, c := range compositions {
		if dir == c || strings.HasPrefix(dir, c+"/") {
			return true
		}
	}
	return false
}

// domainImports lists the domain packages (or their sub-packages) f imports.
func domainImports(f *ast.File) []string {
	var out []string
	for _, im := range f.Imports {
		p := strings.Trim(im.Path.Value, `"`)
		for _, d := range domains {
			if p == Module+"/"+d || strings.HasPrefix(p, Module+"/"+d+"/") {
				out = append(out, strings.TrimPrefix(p, Module+"/"))
			}
		}
	}
	return out
}

// funcName is Name, or Recv.Name for a method.
func funcName(fn *ast.FuncDecl) string {
	if fn.Recv == nil || len(fn.Recv.List) == 0 {
		return fn.Name.Name
	}
	t := fn.Recv.List[0].Type
	if s, ok := t.(*ast.StarExpr); ok {
		t = s.X
	}
	switch x := t.(type) {
	case *ast.IndexExpr:
		t = x.X
	case *ast.IndexListExpr:
		t = x.X
	}
	if id, ok := t.(*ast.Ident); ok {
		return id.Name + "." + fn.Name.Name
	}
	return fn.Name.Name
}

func sorted(set map[string]bool) []string {
	out := make([]string, 0, len(set))
	for k := range set {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

func exists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}
