package tests

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/fptps/fpt/config"
)

// readDocs reads README.md and every page of docs/, keyed by their path
// from the repository's root.
func readDocs(t *testing.T) map[string]string {
	t.Helper()
	pages, err := filepath.Glob("../docs/*.md")
	if err != nil {
		t.Fatal(err)
	}
	docs := map[string]string{}
	for _, p := range append([]string{"../README.md"}, pages...) {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		docs[strings.TrimPrefix(p, "../")] = string(b)
	}
	return docs
}

// The README opens with the two commands that work on a fresh machine:
// the local cluster and the tests, each a script that exists.
func TestReadmeOpensWithCommands(t *testing.T) {
	readme := readDocs(t)["README.md"]
	block := regexp.MustCompile("(?s)^# fpt\n\n```sh\n(.*?)\n```").FindStringSubmatch(readme)
	if block == nil {
		t.Fatalf("README.md does not open with a sh block after its title:\n%.300s", readme)
	}
	lines := strings.Split(block[1], "\n")
	for i, want := range []string{"scripts/run_test.sh", "scripts/test.sh"} {
		if i >= len(lines) || strings.Fields(lines[i])[0] != want {
			t.Errorf("README command %d is %q, want %s", i+1, lines[i], want)
		}
		if fi, err := os.Stat("../" + want); err != nil || fi.Mode()&0o111 == 0 {
			t.Errorf("%s: not an executable script (%v)", want, err)
		}
	}
}

// Every variable fpt knows is named in the docs: a node's in the
// environment table of docs/running.md, the others on some page; and every
// row of that table is a variable fpt knows.
func TestDocVariables(t *testing.T) {
	docs := readDocs(t)
	running := docs["docs/running.md"]
	table := regexp.MustCompile("(?m)^\\| `([A-Z_0-9]+)`(?:, `([A-Z_0-9]+)`)?")
	inTable := map[string]bool{}
	for _, m := range table.FindAllStringSubmatch(running, -1) {
		for _, name := range m[1:] {
			if name != "" {
				inTable[name] = true
			}
		}
	}
	// The pages' words (\w runs): a name is on a page, as \bNAME\b would
	// match it, if it is one of them. One pass over the pages rather than
	// a regexp per variable, which the race detector makes slow.
	words := map[string]bool{}
	word := regexp.MustCompile(`\w+`)
	for _, d := range docs {
		for _, w := range word.FindAllString(d, -1) {
			words[w] = true
		}
	}
	known := map[string]bool{}
	for _, v := range config.Known() {
		known[v.Name] = true
		switch {
		case v.Use == config.NodeVar && !inTable[v.Name]:
			t.Errorf("%s: a node's variable missing from the environment table of docs/running.md", v.Name)
		case v.Use != config.LauncherVar && !words[v.Name]:
			t.Errorf("%s: named on no page of README.md and docs/", v.Name)
		}
	}
	for name := range inTable {
		if !known[name] {
			t.Errorf("docs/running.md lists %s, which config.Known does not", name)
		}
	}
}

// Every relative link of the README and the docs leads to a file that
// exists and, with a #fragment, to a heading of it (GitHub's anchors).
func TestDocLinks(t *testing.T) {
	docs := readDocs(t)
	anchors := map[string]map[string]bool{}
	heading := regexp.MustCompile("(?m)^#{1,6} (.+)$")
	for path, text := range docs {
		anchors[path] = map[string]bool{}
		inCode := false
		for _, line := range strings.Split(text, "\n") {
			if strings.HasPrefix(line, "```") {
				inCode = !inCode
			}
			if m := heading.FindStringSubmatch(line); m != nil && !inCode {
				anchors[path][slug(m[1])] = true
			}
		}
	}
	link := regexp.MustCompile(`\]\(([^)\s]+)\)`)
	fence := regexp.MustCompile("(?ms)^```.*?^```")
	for path, text := range docs {
		for _, m := range link.FindAllStringSubmatch(fence.ReplaceAllString(text, ""), -1) {
			target := m[1]
			if strings.Contains(target, "://") {
				continue
			}
			file, frag, _ := strings.Cut(target, "#")
			dest := path
			if file != "" {
				dest = filepath.Clean(filepath.Join(filepath.Dir(path), file))
				if _, err := os.Stat("../" + dest); err != nil {
					t.Errorf("%s: link %s: %v", path, target, err)
					continue
				}
			}
			if frag != "" && anchors[dest] != nil && !anchors[dest][frag] {
				t.Errorf("%s: link %s: %s has no heading #%s", path, target, dest, frag)
			}
		}
	}
}

// slug is GitHub's anchor for a heading: lower case, code marks and
// punctuation dropped, spaces as hyphens.
func slug(h string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(h) {
		switch {
		case r == ' ':
			b.WriteByte('-')
		case r == '-' || r == '_' || r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r > 127:
			b.WriteRune(r)
		}
	}
	return b.String()
}
