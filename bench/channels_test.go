package bench

import (
	"reflect"
	"testing"
)

// The channels scenario's table has a column per header, and its JSON
// names the fields the comparison is read by.
func TestChannelsResultRow(t *testing.T) {
	r := channelsResult{Scenario: scenarioChannels, Rate: "1gbit", FlowCap: "200mbit", Channels: 4, TensorBytes: 32 << 20, Iters: 5,
		GoodputGbps: 1.2345, VsOne: 3.2109, Checked: true}
	want := []string{"channels", "1gbit", "200mbit", "4", sizeText(32 << 20), "5", "1.234", "3.21", "true"}
	if got := r.row(); !reflect.DeepEqual(got, want) {
		t.Fatalf("row %q, want %q", got, want)
	}
	if len(channelsHeader) != len(want) {
		t.Fatalf("%d header columns for rows of %d", len(channelsHeader), len(want))
	}
	typ := reflect.TypeOf(r)
	for name, field := range map[string]string{"channels": "Channels", "goodput_gbps": "GoodputGbps", "checked": "Checked"} {
		f, ok := typ.FieldByName(field)
		if !ok || f.Tag.Get("json") != name {
			t.Errorf("field %s is not %q in JSON", field, name)
		}
	}
	if channelsCounts[0] != 1 || len(channelsCounts) < 2 {
		t.Errorf("channel counts %v: the comparison needs 1 first", channelsCounts)
	}
}
