package statusweb

import (
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/fptps/fpt/node"
	"github.com/fptps/fpt/status"
)

func get(t *testing.T, url string) (string, http.Header) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %s %v", url, resp.Status, err)
	}
	return string(b), resp.Header
}

func TestHandler(t *testing.T) {
	var board status.Board
	r := status.NewRecorder(true, time.Second, 0)
	r.Started([]node.Info{{ID: node.SchedulerID, Role: node.Scheduler, Host: "127.0.0.1", ControlPort: 9000}}, time.Now())
	board.Publish(r.Snapshot(time.Now(), nil))
	srv := httptest.NewServer(Handler(&board))
	defer srv.Close()

	js, h := get(t, srv.URL+"/status.json")
	var s status.Snapshot
	if err := json.Unmarshal([]byte(js), &s); err != nil {
		t.Fatalf("status.json: %v: %s", err, js)
	}
	if s.Phase != "running" || len(s.Members) != 1 || h.Get("Cache-Control") != "no-store" {
		t.Errorf("status.json: phase %q, %d members, Cache-Control %q", s.Phase, len(s.Members), h.Get("Cache-Control"))
	}

	page, _ := get(t, srv.URL+"/")
	// Everything the page loads is served here: no absolute URL, no CDN.
	refs := regexp.MustCompile(`(?:src|href)="([^"]*)"`).FindAllStringSubmatch(page, -1)
	if len(refs) < 4 {
		t.Fatalf("the page references %d files, want the page's script and style and uPlot's", len(refs))
	}
	for _, m := range refs {
		if strings.Contains(m[1], "//") {
			t.Errorf("the page loads %s from elsewhere", m[1])
		}
		if body, _ := get(t, srv.URL+"/"+m[1]); body == "" {
			t.Errorf("%s is empty", m[1])
		}
	}
}

func TestListenAddr(t *testing.T) {
	for _, tc := range []struct {
		addr     string
		loopback bool
		want     string // "" : refused
	}{
		{":8080", true, "127.0.0.1:8080"},
		{"127.0.0.1:0", true, "127.0.0.1:0"},
		{"localhost:9", true, "localhost:9"},
		{"[::1]:9", true, "[::1]:9"},
		{"10.0.0.1:9", true, ""},
		{"0.0.0.0:9", true, ""},
		{":8080", false, ":8080"},
		{"10.0.0.1:9", false, "10.0.0.1:9"},
		{"nonsense", false, ""},
	} {
		got, err := ListenAddr(tc.addr, tc.loopback)
		if got != tc.want || (err == nil) != (tc.want != "") {
			t.Errorf("ListenAddr(%q, %v) = %q, %v; want %q", tc.addr, tc.loopback, got, err, tc.want)
		}
	}
}

func TestServe(t *testing.T) {
	var board status.Board
	s, err := Serve("127.0.0.1:0", &board, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	js, _ := get(t, s.URL()+"status.json")
	if !strings.Contains(js, `"phase":"registering"`) {
		t.Errorf("an empty board: %s", js)
	}
	if err := s.Close(); err != nil {
		t.Error(err)
	}
	again, err := Serve(strings.TrimPrefix(strings.TrimSuffix(s.URL(), "/"), "http://"), &board, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatalf("the port is free again after Close: %v", err)
	}
	again.Close()
}
