"""Edge-device agent: local training and the uplink encoder."""
