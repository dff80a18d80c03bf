import './base.css';
import './runpage.css';
