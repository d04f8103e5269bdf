package config

import (
	"strings"
	"testing"
)

func TestLocalAggregation(t *testing.T) {
	tests := []struct {
		name    string
		env     map[string]string
		want    LocalAggregation
		host    string
		errWith []string // an error naming all of these
	}{
		{"unset", nil, LocalAggregationOff, "198.18.0.2", nil},
		{"off", map[string]string{"FPT_LOCAL_AGGREGATION": "off"}, LocalAggregationOff, "198.18.0.2", nil},
		{"auto", map[string]string{"FPT_LOCAL_AGGREGATION": " auto "}, LocalAggregationAuto, "198.18.0.2", nil},
		{"host id names the host", map[string]string{"FPT_HOST_ID": "rack1-a"}, LocalAggregationOff, "rack1-a", nil},
		{"on", map[string]string{"FPT_LOCAL_AGGREGATION": "on", "FPT_LB": "off"}, LocalAggregationOn, "198.18.0.2", nil},
		{"on with the LB", map[string]string{"FPT_LOCAL_AGGREGATION": "on"}, LocalAggregationOn, "198.18.0.2", nil},
		{"on with server retry", map[string]string{"FPT_LOCAL_AGGREGATION": "on", "FPT_LB": "off", "FPT_ON_SERVER_LOSS": "retry"}, LocalAggregationOn, "198.18.0.2", nil},
		{"on with continue", map[string]string{"FPT_LOCAL_AGGREGATION": "on", "FPT_LB": "off", "FPT_ON_WORKER_LOSS": "continue"}, LocalAggregationOn, "198.18.0.2", nil},
		{"on with wait", map[string]string{"FPT_LOCAL_AGGREGATION": "on", "FPT_LB": "off", "FPT_ON_WORKER_LOSS": "wait"}, LocalAggregationOn, "198.18.0.2", nil},
		{"word", map[string]string{"FPT_LOCAL_AGGREGATION": "yes"}, 0, "", []string{"FPT_LOCAL_AGGREGATION", "off, auto or on"}},
		{"host id too long", map[string]string{"FPT_HOST_ID": strings.Repeat("h", MaxHostIDLen+1)}, 0, "", []string{"FPT_HOST_ID", "longer than"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := base()
			e["DMLC_NODE_HOST"] = "198.18.0.2"
			for k, v := range tt.env {
				e[k] = v
			}
			c, err := FromEnv(env(e))
			if tt.errWith != nil {
				if err == nil {
					t.Fatal("no error")
				}
				for _, w := range tt.errWith {
					if !strings.Contains(err.Error(), w) {
						t.Errorf("error %q does not name %q", err, w)
					}
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if c.LocalAggregation != tt.want || c.Host() != tt.host {
				t.Errorf("LocalAggregation %v, Host %q; want %v, %q", c.LocalAggregation, c.Host(), tt.want, tt.host)
			}
		})
	}
}

func TestSumsLocally(t *testing.T) {
	tests := []struct {
		name    string
		la      LocalAggregation
		retry   bool
		perHost []int
		want    bool
	}{
		{"off", LocalAggregationOff, false, []int{4, 4}, false},
		{"on, every worker alone", LocalAggregationOn, false, []int{1, 1}, true},
		{"auto, a host of several", LocalAggregationAuto, false, []int{4, 3, 1}, true},
		{"auto, every worker alone", LocalAggregationAuto, false, []int{1, 1, 1}, false},
		{"auto, no worker", LocalAggregationAuto, false, nil, false},
		{"auto with server retry", LocalAggregationAuto, true, []int{4, 4}, true},
		{"auto with server retry, every worker alone", LocalAggregationAuto, true, []int{1, 1}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := Config{LocalAggregation: tt.la, RetryServerLoss: tt.retry}
			if got := c.SumsLocally(tt.perHost); got != tt.want {
				t.Errorf("SumsLocally(%v) = %v, want %v", tt.perHost, got, tt.want)
			}
		})
	}
}

func TestSegmentDir(t *testing.T) {
	if got := (&Config{}).SegmentDir(); got != DefaultLocalAggregationDir {
		t.Errorf("a Config not read from the environment: %q, want %q", got, DefaultLocalAggregationDir)
	}
	c, err := FromEnv(env(map[string]string{"DMLC_ROLE": "worker", "DMLC_PS_ROOT_URI": "127.0.0.1", "DMLC_PS_ROOT_PORT": "9000",
		"DMLC_NUM_SERVER": "1", "DMLC_NUM_WORKER": "1", "FPT_LOCAL_AGGREGATION_DIR": "/run/fpt"}))
	if err != nil {
		t.Fatal(err)
	}
	if got := c.SegmentDir(); got != "/run/fpt" {
		t.Errorf("FPT_LOCAL_AGGREGATION_DIR=/run/fpt: %q", got)
	}
}
