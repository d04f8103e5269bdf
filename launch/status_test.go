package launch_test

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/fptps/fpt/config"
	"github.com/fptps/fpt/internal/localcluster"
	"github.com/fptps/fpt/launch"
)

// A scheduler with FPT_STATUS_ADDR serves its page (status.json says it is
// registering while no node came), on loopback only without a secret:
// another host's address is refused at start, naming the variable.
func TestSchedulerStatusAddr(t *testing.T) {
	port, err := localcluster.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		addr, secret string
		wantErr      bool
	}{
		{":0", "", false},         // becomes 127.0.0.1:0
		{"192.0.2.1:0", "", true}, // protected mode: loopback only
		{"127.0.0.1:0", "0123456789abcdef", false},
	} {
		env := map[string]string{"DMLC_ROLE": "scheduler", "DMLC_PS_ROOT_URI": "127.0.0.1", "DMLC_PS_ROOT_PORT": strconv.Itoa(port),
			"DMLC_NUM_SERVER": "1", "DMLC_NUM_WORKER": "1", "FPT_STATUS_ADDR": tc.addr}
		if tc.secret != "" {
			env["FPT_CLUSTER_SECRET"] = tc.secret
		}
		cfg, err := config.FromEnv(func(k string) (string, bool) { v, ok := env[k]; return v, ok })
		if err != nil {
			t.Fatal(err)
		}
		n, err := launch.Start(context.Background(), cfg, launch.Deps{Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
		if tc.wantErr {
			if err == nil || !strings.Contains(err.Error(), "FPT_STATUS_ADDR") {
				t.Errorf("%s without a secret: %v, want an error naming FPT_STATUS_ADDR", tc.addr, err)
			}
			if n != nil {
				n.Close()
			}
			continue
		}
		if err != nil {
			t.Fatalf("%s: %v", tc.addr, err)
		}
		url := n.StatusURL()
		if !strings.HasPrefix(url, "http://127.0.0.1:") {
			t.Errorf("%s: page at %q, want loopback", tc.addr, url)
		}
		resp, err := http.Get(url + "status.json")
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if !strings.Contains(string(body), `"phase":"registering"`) {
			t.Errorf("%s: status.json %s, want registering", tc.addr, body)
		}
		n.Close()
		if _, err := http.Get(url + "status.json"); err == nil {
			t.Errorf("%s: the page is still served after Close", tc.addr)
		}
	}
}
