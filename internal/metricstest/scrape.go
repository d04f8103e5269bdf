// Package metricstest reads a node's Prometheus metrics from outside, as a
// scrape would: for the tests and fpt bench, which check or measure a
// running cluster through them.
package metricstest

import (
	"context"
	"fmt"
	"net/http"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// Families is a parsed scrape, by metric name.
type Families map[string]*dto.MetricFamily

// Scrape GETs http://addr/metrics and parses the text exposition, for
// programs that read another node's figures (benchmarks, tests).
func Scrape(ctx context.Context, addr string) (Families, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/metrics", nil)
	if err != nil {
		return nil, fmt.Errorf("metricstest: scrape %s: %w", addr, err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("metricstest: scrape %s: %w", addr, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("metricstest: scrape %s: %s", addr, resp.Status)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	mfs, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("metricstest: scrape %s: %w", addr, err)
	}
	return mfs, nil
}

// Value is the value of the first series of the named metric whose labels
// include every one given (a histogram's: its sample count), and whether
// there is one.
func (f Families) Value(name string, labels map[string]string) (float64, bool) {
	mf := f[name]
	if mf == nil {
		return 0, false
	}
	for _, m := range mf.GetMetric() {
		have := make(map[string]string, len(m.GetLabel()))
		for _, l := range m.GetLabel() {
			have[l.GetName()] = l.GetValue()
		}
		match := true
		for k, v := range labels {
			if have[k] != v {
				match = false
				break
			}
		}
		if !match {
			continue
		}
		switch {
		case m.GetCounter() != nil:
			return m.GetCounter().GetValue(), true
		case m.GetGauge() != nil:
			return m.GetGauge().GetValue(), true
		case m.GetHistogram() != nil:
			return float64(m.GetHistogram().GetSampleCount()), true
		}
	}
	return 0, false
}
