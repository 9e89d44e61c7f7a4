package codestyle

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// maxFuncLines is the longest a function's body may run (from its
// signature's line to its closing brace) before its doc comment must say
// why, in a sentence that starts with lengthReason.
const maxFuncLines = 80

// lengthReason opens the sentence of a long function's doc comment that
// gives the reason (for example "It is long because the steps are one
// sequence whose undo is shared; docs/architecture.md numbers them.").
const lengthReason = "It is long because"

// repoRoot is the module's root: two levels above this package.
func repoRoot(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		t.Fatalf("no go.mod at %s: %v", root, err)
	}
	return root
}

// longFunction is a function over maxFuncLines without a stated reason.
type longFunction struct {
	pos   token.Position
	name  string
	lines int
}

// longFunctions parses every non-test Go file under dirs (relative to
// root) and returns the functions and methods over maxFuncLines whose doc
// comment gives no reason.
func longFunctions(t *testing.T, root string, dirs ...string) []longFunction {
	t.Helper()
	fset := token.NewFileSet()
	var found []longFunction
	for _, dir := range dirs {
		err := filepath.WalkDir(filepath.Join(root, dir), func(path string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if d.IsDir() {
				if name := d.Name(); name == "testdata" || strings.HasPrefix(name, ".") {
					return filepath.SkipDir
				}
				return nil
			}
			if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
				return nil
			}
			file, err := parser.ParseFile(fset, path, nil, parser.ParseComments|parser.SkipObjectResolution)
			if err != nil {
				return err
			}
			for _, decl := range file.Decls {
				fn, ok := decl.(*ast.FuncDecl)
				if !ok || fn.Body == nil {
					continue
				}
				lines := fset.Position(fn.End()).Line - fset.Position(fn.Pos()).Line
				if lines <= maxFuncLines || (fn.Doc != nil && strings.Contains(fn.Doc.Text(), lengthReason)) {
					continue
				}
				name := fn.Name.Name
				if fn.Recv != nil && len(fn.Recv.List) == 1 {
					name = receiverName(fn.Recv.List[0].Type) + "." + name
				}
				pos := fset.Position(fn.Pos())
				pos.Filename, _ = filepath.Rel(root, pos.Filename)
				found = append(found, longFunction{pos: pos, name: name, lines: lines})
			}
			return nil
		})
		if err != nil {
			t.Fatalf("walking %s: %v", dir, err)
		}
	}
	return found
}

// receiverName is the type name of a method's receiver (T for *T, T[K]).
func receiverName(expr ast.Expr) string {
	switch e := expr.(type) {
	case *ast.StarExpr:
		return receiverName(e.X)
	case *ast.IndexExpr:
		return receiverName(e.X)
	case *ast.IndexListExpr:
		return receiverName(e.X)
	case *ast.Ident:
		return e.Name
	}
	return "?"
}

// TestFunctionLength fails for every function of the product's code
// (cmd/, internal/) over maxFuncLines whose doc comment does not say why.
func TestFunctionLength(t *testing.T) {
	root := repoRoot(t)
	for _, f := range longFunctions(t, root, "cmd", "internal") {
		t.Errorf("%s: %s is %d lines (over %d) and its doc comment has no %q sentence: split it, or say why it is one function",
			f.pos, f.name, f.lines, maxFuncLines, lengthReason)
	}
}

// TestLongFunctionsFound checks the checker on a file made for it: a
// function of 81 lines is found, the same with a reason is not, and one of
// 80 lines is not.
func TestLongFunctionsFound(t *testing.T) {
	root := t.TempDir()
	if err := os.WriteFile(filepath.Join(root, "go.mod"), []byte("module x\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(root, "p"), 0o755); err != nil {
		t.Fatal(err)
	}
	body := func(n int) string { return strings.Repeat("\t_ = 1\n", n-1) }
	src := "package p\n\n" +
		"// long has no reason.\nfunc long() {\n" + body(81) + "}\n\n" +
		"// excused is as long.\n// It is long because it is a test.\nfunc excused() {\n" + body(81) + "}\n\n" +
		"// fits is at the limit.\nfunc fits() {\n" + body(80) + "}\n\n" +
		"type T struct{}\n\n// method is long too.\nfunc (*T) method() {\n" + body(81) + "}\n"
	if err := os.WriteFile(filepath.Join(root, "p", "p.go"), []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "p", "p_test.go"), []byte("package p\n\nfunc testLong() {\n"+body(90)+"}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	got := longFunctions(t, root, "p")
	var names []string
	for _, f := range got {
		names = append(names, f.name)
	}
	if strings.Join(names, ",") != "long,T.method" {
		t.Fatalf("found %v, want [long T.method]", names)
	}
	if got[0].lines != 81 || got[0].pos.Filename != filepath.Join("p", "p.go") {
		t.Fatalf("long: %+v", got[0])
	}
}
