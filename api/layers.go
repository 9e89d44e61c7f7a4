package api

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
)

// UnmarshalJSON accepts a layer reference string or an attachment object
// (unknown fields refused).
func (a *LayerAttachment) UnmarshalJSON(b []byte) error {
	b = bytes.TrimSpace(b)
	if len(b) > 0 && b[0] == '"' {
		var ref string
		if err := json.Unmarshal(b, &ref); err != nil {
			return err
		}
		*a = LayerAttachment{Layer: ref}
		return nil
	}
	if len(b) == 0 || b[0] != '{' {
		return errors.New("a layer is a reference string or an object {layer, mount, protected}")
	}
	type plain LayerAttachment
	var p plain
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&p); err != nil {
		return fmt.Errorf("layer attachment: %w", err)
	}
	*a = LayerAttachment(p)
	return nil
}

// MarshalJSON writes the short string form when there is no mount point.
func (a LayerAttachment) MarshalJSON() ([]byte, error) {
	if a.Mount == "" && !a.Protected {
		return json.Marshal(a.Layer)
	}
	type plain LayerAttachment
	return json.Marshal(plain(a))
}
